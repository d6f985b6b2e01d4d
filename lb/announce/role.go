package announce

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Role decides which process on this host answers on the bridge: several
// CCM replicas may run beside it, but only one may ever answer, and
// answers should not stop while no replica leads (the leader was killed,
// or the API server is unreachable and the leader exited when it could not
// renew its lease).
//
// Two locks in the abstract Unix socket namespace of the bridge's network
// namespace do it, each held by a listening socket; any local user can
// bind such a name, so only root's sockets count (see names):
//   - "leader": held by the replica that leads (Lead), for its lifetime;
//   - "host": held by whoever answers on the bridge.
//
// The kernel frees a name the instant the sockets holding it close (a
// SIGKILLed process's too), and whoever is connected to a name sees that
// at once: a replica waiting for a name watches it over a connection
// instead of polling, so a dead leader is replaced within a millisecond,
// not a poll period.
//
// The leader answers from its placement. A replica that does not lead
// (Stand) takes "host" only while no one holds "leader", and then answers
// from the host's permanent neighbour entries, the record the last leader
// left (VIP → answering node's MAC); it never writes them nor sends
// gratuitous ARP. It lets go as soon as a leader appears (a leader waiting
// for "host" connects to it, which wakes the stand-in), and the leader
// waits for "host" before it answers: so at no moment do two processes
// answer, and since every replica places VIPs with the same pure function,
// the answers do not change hands between MACs either. Requests that
// arrive while no process answers (the moments a dying leader's process
// takes to release its names) are answered on taking over (see
// Announcer.SetActive).
type Role struct {
	a      *Announcer
	keep   func(netip.Addr) bool
	leader *names
	host   *names
	poll   time.Duration
	wake   chan struct{} // wakes the stand-in loop

	mu         sync.Mutex
	hostLock   *nameLock // nil unless this process holds "host"
	leaderLock *nameLock // nil unless this process leads
	leading    bool
}

// NewRole coordinates a on the host under id (e.g. the bridge name; names
// are per network namespace). keep filters the recorded neighbour entries
// a stand-in answers for (e.g. addresses in the pools).
func NewRole(a *Announcer, id string, keep func(netip.Addr) bool) *Role {
	r := &Role{
		a:      a,
		keep:   keep,
		leader: newNames("@labcloud/announce/"+id+"/leader", nil),
		poll:   50 * time.Millisecond,
		wake:   make(chan struct{}, 1),
	}
	r.host = newNames("@labcloud/announce/"+id+"/host", r.poke)
	return r
}

func (r *Role) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Stand makes a inactive and, until ctx ends or this process leads,
// stands in for a missing leader. It returns at once.
func (r *Role) Stand(ctx context.Context) {
	r.a.SetActive(false)
	go func() {
		t := time.NewTicker(r.poll)
		defer t.Stop()
		for {
			gone, ok := r.standTick(ctx)
			if !ok {
				return
			}
			select {
			case <-ctx.Done():
				r.mu.Lock()
				if !r.leading {
					r.dropHost()
				}
				r.mu.Unlock()
				return
			case <-gone:
			case <-r.wake:
			case <-t.C:
			}
		}
	}()
}

// standTick is one look at the host; false once this process leads. The
// channel, if not nil, closes when the name that keeps this process from
// answering (a leader's, or another stand-in's "host") is freed.
func (r *Role) standTick(ctx context.Context) (<-chan struct{}, bool) {
	log := klog.FromContext(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leading {
		return nil, false
	}
	if ctx.Err() != nil {
		// Ended (perhaps while this process led): stand in no more.
		r.dropHost()
		return nil, false
	}
	if gone, led := r.leader.watch(ctx); led {
		if r.hostLock != nil {
			log.Info("A leader answers on the bridge again; standing down")
			r.dropHost()
		}
		return gone, true
	}
	if r.hostLock != nil {
		r.adoptRecord(ctx)
		return nil, true
	}
	hostLock, err := r.host.try(ctx)
	if err != nil {
		var held *heldError
		switch {
		case !errors.As(err, &held):
			r.host.fail(ctx, err)
			return nil, true
		case held.contended:
			return nil, true // both let go: retry at the next tick
		}
		// Another stand-in answers: take over the moment it goes.
		gone, ok := r.host.watch(ctx)
		if !ok {
			r.poke() // freed meanwhile (a dying leader's last names)
		}
		return gone, true
	}
	r.hostLock = hostLock
	r.adoptRecord(ctx)
	r.a.SetActive(true)
	log.Info("No leader answers on the bridge; answering from the host's neighbour entries", "vips", len(r.a.Answering()), "name", hostLock.name)
	return nil, true
}

func (r *Role) adoptRecord(ctx context.Context) {
	rec, err := r.a.Recorded()
	if err != nil {
		klog.FromContext(ctx).V(2).Info("Reading the neighbour record", "err", err)
		return
	}
	for ip := range rec {
		if !r.keep(ip) {
			delete(rec, ip)
		}
	}
	r.a.Adopt(rec)
}

// dropHost stops answering, then frees "host". Callers hold mu.
func (r *Role) dropHost() {
	if r.hostLock == nil {
		return
	}
	r.a.SetActive(false)
	r.a.Adopt(nil)
	r.hostLock.release()
	r.hostLock = nil
}

// Lead blocks until this process is the host's announcer: it claims
// "leader" (waiting for a previous leader on this host to die) and then
// "host" (which a stand-in frees as soon as it sees the leader), and
// activates a. Until the caller sets its own placement, a answers from the
// host's record, as the stand-in it replaces did. A stand-in in this same
// process hands over without a gap. Both names are freed when ctx ends
// (or the process dies).
func (r *Role) Lead(ctx context.Context) error {
	log := klog.FromContext(ctx)
	leaderLock, err := r.leader.await(ctx)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.leaderLock, r.leading = leaderLock, true
	holding := r.hostLock != nil
	r.mu.Unlock()
	r.poke() // the stand-in loop ends now, not once this lead is over
	if !holding {
		hostLock, err := r.host.await(ctx)
		if err != nil {
			r.release()
			return err
		}
		r.mu.Lock()
		r.hostLock = hostLock
		r.adoptRecord(ctx)
		r.mu.Unlock()
	}
	r.a.SetActive(true)
	log.Info("Leading: answering on the bridge", "name", leaderLock.name)
	go func() {
		<-ctx.Done()
		r.release()
	}()
	return nil
}

func (r *Role) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.a.SetActive(false)
	if r.hostLock != nil {
		r.hostLock.release()
		r.hostLock = nil
	}
	if r.leaderLock != nil {
		r.leaderLock.release()
		r.leaderLock = nil
	}
	r.leading = false
}
