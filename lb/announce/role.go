package announce

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Role decides which process on this host answers on the bridge: several
// CCM replicas may run beside it, but only one may ever answer, and
// answers should not stop while no replica leads (the leader was killed,
// or the API server is unreachable and the leader exited when it could not
// renew its lease).
//
// Two names in the abstract Unix socket namespace of the bridge's network
// namespace do it; the kernel frees a name the instant its holder dies, so
// a SIGKILLed leader hands over at once:
//   - "leader": held by the replica that leads (Lead), for its lifetime;
//   - "host": held by whoever answers on the bridge.
//
// The leader answers from its placement. A replica that does not lead
// (Stand) takes "host" only while no one holds "leader", and then answers
// from the host's permanent neighbour entries, the record the last leader
// left (VIP → answering node's MAC); it never writes them nor sends
// gratuitous ARP. It lets go as soon as a leader appears, and the leader
// waits for "host" before it answers: so at no moment do two processes
// answer, and since every replica places VIPs with the same pure function,
// the answers do not change hands between MACs either.
type Role struct {
	a       *Announcer
	keep    func(netip.Addr) bool
	leader  string
	host    string
	poll    time.Duration
	mu      sync.Mutex
	hostFD  int // -1 unless this process holds "host"
	leadFD  int // -1 unless this process leads
	leading bool
}

// NewRole coordinates a on the host under id (e.g. the bridge name; names
// are per network namespace). keep filters the recorded neighbour entries
// a stand-in answers for (e.g. addresses in the pools).
func NewRole(a *Announcer, id string, keep func(netip.Addr) bool) *Role {
	return &Role{
		a:      a,
		keep:   keep,
		leader: "@labcloud/announce/" + id + "/leader",
		host:   "@labcloud/announce/" + id + "/host",
		poll:   50 * time.Millisecond,
		hostFD: -1,
		leadFD: -1,
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
			if !r.standTick(ctx) {
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
			case <-t.C:
			}
		}
	}()
}

// standTick is one look at the host; false once this process leads.
func (r *Role) standTick(ctx context.Context) bool {
	log := klog.FromContext(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leading {
		return false
	}
	led := inUse(r.leader)
	switch {
	case r.hostFD >= 0 && led:
		r.dropHost()
		log.Info("A leader answers on the bridge again; standing down")
	case r.hostFD >= 0:
		r.adoptRecord(ctx)
	case !led:
		fd, err := bindName(r.host)
		if err != nil {
			return true
		}
		r.hostFD = fd
		r.adoptRecord(ctx)
		r.a.SetActive(true)
		log.Info("No leader answers on the bridge; answering from the host's neighbour entries", "vips", len(r.a.Answering()))
	}
	return true
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
	if r.hostFD < 0 {
		return
	}
	r.a.SetActive(false)
	r.a.Adopt(nil)
	unix.Close(r.hostFD)
	r.hostFD = -1
}

// Lead blocks until this process is the host's announcer: it claims
// "leader" (waiting for a previous leader on this host to die) and then
// "host" (which a stand-in frees within its poll period), and activates a.
// A stand-in in this same process hands over without a gap. Both names
// are freed when ctx ends (or the process dies).
func (r *Role) Lead(ctx context.Context) error {
	log := klog.FromContext(ctx)
	fd, err := r.await(ctx, r.leader)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.leadFD, r.leading = fd, true
	holding := r.hostFD >= 0
	r.mu.Unlock()
	if !holding {
		hfd, err := r.await(ctx, r.host)
		if err != nil {
			r.release()
			return err
		}
		r.mu.Lock()
		r.hostFD = hfd
		r.mu.Unlock()
	}
	r.a.SetActive(true)
	log.Info("Leading: answering on the bridge")
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
	if r.hostFD >= 0 {
		unix.Close(r.hostFD)
		r.hostFD = -1
	}
	if r.leadFD >= 0 {
		unix.Close(r.leadFD)
		r.leadFD = -1
	}
	r.leading = false
}

// await binds name, retrying every few milliseconds until ctx ends.
func (r *Role) await(ctx context.Context, name string) (int, error) {
	for {
		fd, err := bindName(name)
		if err == nil {
			return fd, nil
		}
		if !errors.Is(err, unix.EADDRINUSE) {
			return -1, fmt.Errorf("claiming %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("waiting for %s: %w", name, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// bindName binds a datagram socket to an abstract Unix name; the name is
// held until the socket is closed.
func bindName(name string) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: name}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// inUse reports whether someone holds name.
func inUse(name string) bool {
	fd, err := bindName(name)
	if err != nil {
		return errors.Is(err, unix.EADDRINUSE)
	}
	unix.Close(fd)
	return false
}
