package announce

import (
	"context"
	"errors"
	"fmt"
	"net"
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
// namespace do it, each held by a listening socket:
//   - "leader": held by the replica that leads (Lead), for its lifetime;
//   - "host": held by whoever answers on the bridge.
//
// The kernel frees a name the instant its holder's sockets close (a
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
	leader string
	host   string
	poll   time.Duration
	wake   chan struct{} // wakes the stand-in loop

	mu      sync.Mutex
	hostH   *holder // nil unless this process holds "host"
	leadH   *holder // nil unless this process leads
	leading bool
	// watches are the stand-in's open watches of names others hold.
	watches map[string]<-chan struct{}
}

// NewRole coordinates a on the host under id (e.g. the bridge name; names
// are per network namespace). keep filters the recorded neighbour entries
// a stand-in answers for (e.g. addresses in the pools).
func NewRole(a *Announcer, id string, keep func(netip.Addr) bool) *Role {
	return &Role{
		a:       a,
		keep:    keep,
		leader:  "@labcloud/announce/" + id + "/leader",
		host:    "@labcloud/announce/" + id + "/host",
		poll:    50 * time.Millisecond,
		wake:    make(chan struct{}, 1),
		watches: map[string]<-chan struct{}{},
	}
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
	if gone, led := r.watch(ctx, r.leader); led {
		if r.hostH != nil {
			r.dropHost()
			log.Info("A leader answers on the bridge again; standing down")
		}
		return gone, true
	}
	if r.hostH != nil {
		r.adoptRecord(ctx)
		return nil, true
	}
	h, err := claim(r.host, r.poke)
	if err != nil {
		// Another stand-in answers: take over the moment it goes.
		gone, held := r.watch(ctx, r.host)
		if !held {
			r.poke() // freed meanwhile (a dying leader's last names)
		}
		return gone, true
	}
	r.hostH = h
	r.adoptRecord(ctx)
	r.a.SetActive(true)
	log.Info("No leader answers on the bridge; answering from the host's neighbour entries", "vips", len(r.a.Answering()))
	return nil, true
}

// watch is the package's watch, keeping one connection per name while
// its holder lives. Callers hold mu.
func (r *Role) watch(ctx context.Context, name string) (<-chan struct{}, bool) {
	if g, ok := r.watches[name]; ok {
		select {
		case <-g:
			delete(r.watches, name)
		default:
			return g, true
		}
	}
	g, held := watch(ctx, name)
	if g != nil {
		r.watches[name] = g
	}
	return g, held
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
	if r.hostH == nil {
		return
	}
	r.a.SetActive(false)
	r.a.Adopt(nil)
	r.hostH.release()
	r.hostH = nil
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
	lh, err := await(ctx, r.leader, nil)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.leadH, r.leading = lh, true
	holding := r.hostH != nil
	r.mu.Unlock()
	if !holding {
		hh, err := await(ctx, r.host, nil)
		if err != nil {
			r.release()
			return err
		}
		r.mu.Lock()
		r.hostH = hh
		r.adoptRecord(ctx)
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
	if r.hostH != nil {
		r.hostH.release()
		r.hostH = nil
	}
	if r.leadH != nil {
		r.leadH.release()
		r.leadH = nil
	}
	r.leading = false
}

// holder holds an abstract name with a listening socket. It keeps every
// connection made to it open until the peer closes it or the name is
// released, so that a connected peer learns of the release (or of this
// process's death) at once, by end of file.
type holder struct {
	l *net.UnixListener

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// claim takes name; an error wrapping unix.EADDRINUSE if someone holds it.
// onConn, if not nil, is called for each connection made to it.
func claim(name string, onConn func()) (*holder, error) {
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: name, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	h := &holder{l: l, conns: map[net.Conn]struct{}{}}
	go h.serve(onConn)
	return h, nil
}

func (h *holder) serve(onConn func()) {
	for {
		c, err := h.l.Accept()
		if err != nil {
			return // released
		}
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			c.Close()
			return
		}
		h.conns[c] = struct{}{}
		h.mu.Unlock()
		if onConn != nil {
			onConn()
		}
		go func() {
			var b [1]byte
			for {
				if _, err := c.Read(b[:]); err != nil {
					break
				}
			}
			h.mu.Lock()
			delete(h.conns, c)
			h.mu.Unlock()
			c.Close()
		}()
	}
}

// release frees the name and ends every connection to it.
func (h *holder) release() {
	h.mu.Lock()
	h.closed = true
	conns := h.conns
	h.conns = nil
	h.mu.Unlock()
	h.l.Close()
	for c := range conns {
		c.Close()
	}
}

// watch reports whether someone holds name and, if so, returns a channel
// closed the moment they let go of it (or ctx ends). The channel is nil
// (never ready) if the holder cannot be watched, e.g. a name held by an
// older version's plain socket: callers poll then.
func watch(ctx context.Context, name string) (<-chan struct{}, bool) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: name, Net: "unixpacket"})
	if err != nil {
		return nil, !errors.Is(err, unix.ECONNREFUSED) && !errors.Is(err, unix.ENOENT)
	}
	gone := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { c.Close() })
	go func() {
		defer close(gone)
		defer stop()
		defer c.Close()
		var b [1]byte
		for {
			if _, err := c.Read(b[:]); err != nil {
				return
			}
		}
	}()
	return gone, true
}

// await claims name, waiting for its holder to let go until ctx ends.
func await(ctx context.Context, name string, onConn func()) (*holder, error) {
	for {
		h, err := claim(name, onConn)
		if err == nil {
			return h, nil
		}
		if !errors.Is(err, unix.EADDRINUSE) {
			return nil, fmt.Errorf("claiming %s: %w", name, err)
		}
		wctx, cancel := context.WithCancel(ctx)
		gone, held := watch(wctx, name)
		var retry <-chan time.Time
		if !held || gone == nil {
			// Between its holder's bind and listen, or not watchable.
			retry = time.After(5 * time.Millisecond)
		}
		select {
		case <-ctx.Done():
			cancel()
			return nil, fmt.Errorf("waiting for %s: %w", name, ctx.Err())
		case <-gone:
		case <-retry:
		}
		cancel()
	}
}
