package libvirtcloud

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netlink"
	"k8s.io/klog/v2"
	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/libvirtcloud/sshtunnel"
	"github.com/labcloud/labcloud/metrics"
)

var (
	// ErrNotFound means the hypervisor answered and the domain does not exist.
	ErrNotFound = errors.New("domain not found")
	// ErrUnavailable means the hypervisor could not be asked.
	ErrUnavailable = errors.New("hypervisor unavailable")
)

// Options configure one hypervisor connection.
type Options struct {
	URI  string
	Zone string
	// ReadWrite opens a read-write connection; only the guest-agent
	// address source needs one.
	ReadWrite bool
	// Networks whose DHCP leases are read; empty means every active network.
	Networks []string
	// Sources are the address sources in order of preference.
	Sources []AddressSource
	// ResyncPeriod rebuilds the cache from scratch this often.
	ResyncPeriod time.Duration
	// Neighbours reads the host's neighbour table (the "arp" source) as
	// mac → addresses. Defaults to the netlink neighbour tables (ARP and
	// IPv6) of the current namespace, without permanent entries.
	Neighbours func() (map[string][]netip.Addr, error)
	// Exclude names addresses that are never a domain's, whatever a source
	// says: the load balancer's pools (a guest's kube-proxy may hold VIPs,
	// and the host's neighbour entries point VIPs at guests' MACs).
	Exclude func(netip.Addr) bool
}

// Hypervisor is one libvirt connection and the cache it feeds.
type Hypervisor struct {
	opts Options

	connMu sync.RWMutex
	conn   *libvirt.Connect // nil while disconnected

	mu       sync.RWMutex
	domains  index
	leases   map[string][]netip.Addr // mac → addresses from DHCP leases
	leasesAt time.Time
	// netFamilies are the families each network has addresses of, read
	// with the leases: the families its guests may get.
	netFamilies map[string]family
	agent       map[string]agentAnswer      // uuid → addresses from the guest agent
	bad         map[string]UnparsableDomain // uuid → domains left out of domains
	synced      bool                        // the cache reflects a full listing

	neighMu sync.Mutex // one read of the neighbour table at a time
	neigh   map[string][]netip.Addr
	neighAt time.Time

	// ssh is where an ssh URI points (nil for other transports); tunnel
	// carries the current connection over it. Only run touches tunnel.
	ssh    *sshtunnel.Target
	sshErr error
	tunnel *sshtunnel.Conn

	log      logr.Logger                          // for lookups, which have no context
	after    func(time.Duration) <-chan time.Time // waits between connection attempts
	connects int                                  // connections made; only run touches it

	calls   atomic.Uint64
	raw     chan rawEvent
	lost    chan struct{}
	subs    subscribers
	started chan struct{}
	stopped chan struct{} // closed when run has returned
}

// rawEvent is what the libvirt callback hands to the cache loop.
type rawEvent struct {
	uuid   string
	event  libvirt.DomainEventType
	detail int
	at     time.Time // when the callback ran
	tap    string    // the host device of eventTapGone and eventTapBack
}

// Open starts maintaining a connection to opts.URI until ctx ends. It does
// not wait for the hypervisor: lookups fail with ErrUnavailable until it
// answers. WaitSynced waits for the first full listing.
func Open(ctx context.Context, opts Options) (*Hypervisor, error) {
	if err := StartEventLoop(); err != nil {
		return nil, err
	}
	h := newHypervisor(ctx, opts)
	go func() {
		defer close(h.stopped)
		h.run(ctx)
	}()
	return h, nil
}

// newHypervisor is a Hypervisor with its defaults, not yet running.
func newHypervisor(ctx context.Context, opts Options) *Hypervisor {
	if opts.ResyncPeriod <= 0 {
		opts.ResyncPeriod = 5 * time.Minute
	}
	if opts.Neighbours == nil {
		opts.Neighbours = func() (map[string][]netip.Addr, error) { return neighbourTable(&netlink.Handle{}) }
	}
	ssh, sshErr := sshtunnel.Parse(opts.URI)
	return &Hypervisor{
		opts:        opts,
		ssh:         ssh,
		sshErr:      sshErr,
		domains:     newIndex(),
		leases:      map[string][]netip.Addr{},
		netFamilies: map[string]family{},
		agent:       map[string]agentAnswer{},
		bad:         map[string]UnparsableDomain{},
		log:         klog.FromContext(ctx),
		after:       time.After,
		raw:         make(chan rawEvent, 4096),
		lost:        make(chan struct{}, 1),
		started:     make(chan struct{}),
		stopped:     make(chan struct{}),
	}
}

// Zone is the zone this hypervisor stands for.
func (h *Hypervisor) Zone() string { return h.opts.Zone }

// URI is the libvirt URI of this hypervisor.
func (h *Hypervisor) URI() string { return h.opts.URI }

// Calls is the number of libvirt API calls made so far (for benchmarks and
// tests: steady-state lookups must not add to it).
func (h *Hypervisor) Calls() uint64 { return h.calls.Load() }

// called counts one libvirt API call, started at start, and observes its
// latency in labcloud_libvirt_call_duration_seconds.
func (h *Hypervisor) called(call string, start time.Time) {
	h.calls.Add(1)
	metrics.LibvirtCallSeconds.WithLabelValues(call).Observe(time.Since(start).Seconds())
}

// cached publishes the cache's size. Callers hold mu.
func (h *Hypervisor) cached() {
	metrics.LibvirtDomains.WithLabelValues(h.opts.Zone).Set(float64(len(h.domains.byUUID)))
	metrics.LibvirtUnparsableDomains.WithLabelValues(h.opts.Zone).Set(float64(len(h.bad)))
}

// WaitSynced blocks until the first full listing is cached or ctx ends.
func (h *Hypervisor) WaitSynced(ctx context.Context) error {
	select {
	case <-h.started:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for %s: %w", h.opts.URI, ctx.Err())
	}
}

// Connected reports whether the hypervisor is reachable right now.
func (h *Hypervisor) Connected() bool {
	h.connMu.RLock()
	defer h.connMu.RUnlock()
	return h.conn != nil
}

func (h *Hypervisor) run(ctx context.Context) {
	log := klog.FromContext(ctx).WithValues("hypervisor", h.opts.URI)
	reconnect(ctx, log, &backoff{rand: rand.Float64}, h.after, func(ctx context.Context) attempt {
		return h.session(ctx, log)
	})
}

// session makes one connection and serves the cache from it until it is
// lost or ctx ends.
func (h *Hypervisor) session(ctx context.Context, log logr.Logger) attempt {
	conn, callbackIDs, err := h.connect(ctx)
	if err != nil {
		return attempt{err: err}
	}
	log.Info("Connected to hypervisor")
	if h.connects > 0 {
		metrics.LibvirtReconnects.WithLabelValues(h.opts.Zone).Inc()
	}
	h.connects++
	start := time.Now()
	err = h.serve(ctx, conn)
	h.disconnect(conn, callbackIDs)
	return attempt{connected: true, served: time.Since(start), err: err}
}

// A silent remote hypervisor is given up after about (count+1) × interval
// seconds: 4 s. Until then placement keeps its nodes' VIPs where they are;
// after, it probes its guests on the bridge (a libvirtd that is merely slow
// costs a reconnect, not a VIP).
const (
	keepaliveInterval = 1
	keepaliveCount    = 3
)

func (h *Hypervisor) connect(ctx context.Context) (*libvirt.Connect, []int, error) {
	uri, err := h.dial(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("connect %s: %w", h.opts.URI, err)
	}
	var conn *libvirt.Connect
	start := time.Now()
	if h.opts.ReadWrite {
		conn, err = libvirt.NewConnect(uri)
	} else {
		conn, err = libvirt.NewConnectReadOnly(uri)
	}
	h.called("Connect", start)
	if err != nil {
		if h.tunnel != nil {
			err = h.tunnel.Explain(err)
			h.closeTunnel()
		}
		return nil, nil, fmt.Errorf("connect %s: %w", h.opts.URI, err)
	}
	fail := func(what string, err error) (*libvirt.Connect, []int, error) {
		conn.Close()
		h.closeTunnel()
		return nil, nil, fmt.Errorf("%s on %s: %w", what, h.opts.URI, err)
	}
	// Keepalive only exists on remote connections (the test driver says
	// it is unsupported): a host that went silent (a power cut closes no
	// connection) is noticed once keepaliveCount probes, one after each
	// keepaliveInterval without traffic, went unanswered.
	start = time.Now()
	err = conn.SetKeepAlive(keepaliveInterval, keepaliveCount)
	h.called("SetKeepAlive", start)
	if err != nil && !isUnsupported(err) {
		return fail("set keepalive", err)
	}
	start = time.Now()
	err = conn.RegisterCloseCallback(func(*libvirt.Connect, libvirt.ConnectCloseReason) {
		select {
		case h.lost <- struct{}{}:
		default:
		}
	})
	h.called("RegisterCloseCallback", start)
	if err != nil && !isUnsupported(err) {
		return fail("register close callback", err)
	}
	queue := func(d *libvirt.Domain, event libvirt.DomainEventType, detail int) {
		at := time.Now()
		uuid, err := d.GetUUIDString() // local: the event carries the UUID
		if err != nil {
			return
		}
		select {
		case h.raw <- rawEvent{uuid: strings.ToLower(uuid), event: event, detail: detail, at: at}:
		default:
			// The loop is far behind; a full resync repairs the cache.
			select {
			case h.lost <- struct{}{}:
			default:
			}
		}
	}
	var ids []int
	start = time.Now()
	id, err := conn.DomainEventLifecycleRegister(nil, func(_ *libvirt.Connect, d *libvirt.Domain, ev *libvirt.DomainEventLifecycle) {
		queue(d, ev.Event, ev.Detail)
	})
	h.called("DomainEventLifecycleRegister", start)
	if err != nil {
		return fail("register lifecycle events", err)
	}
	ids = append(ids, id)
	// A NIC plugged into or out of a running domain changes its definition
	// without a lifecycle event: refresh it then, as the periodic resync
	// only re-reads definitions whose state changed.
	for _, register := range []func() (int, error){
		func() (int, error) {
			return conn.DomainEventDeviceAddedRegister(nil, func(_ *libvirt.Connect, d *libvirt.Domain, _ *libvirt.DomainEventDeviceAdded) {
				queue(d, eventDeviceChanged, 0)
			})
		},
		func() (int, error) {
			return conn.DomainEventDeviceRemovedRegister(nil, func(_ *libvirt.Connect, d *libvirt.Domain, _ *libvirt.DomainEventDeviceRemoved) {
				queue(d, eventDeviceChanged, 0)
			})
		},
	} {
		start := time.Now()
		id, err := register()
		h.called("DomainEventDeviceRegister", start)
		if err != nil && !isUnsupported(err) {
			for _, id := range ids {
				_ = conn.DomainEventDeregister(id)
			}
			return fail("register device events", err)
		}
		if err == nil {
			ids = append(ids, id)
		}
	}
	return conn, ids, nil
}

// eventDeviceChanged stands for a device added to or removed from a domain;
// libvirt's lifecycle event types are all positive.
const eventDeviceChanged libvirt.DomainEventType = -1

func (h *Hypervisor) disconnect(conn *libvirt.Connect, callbackIDs []int) {
	h.connMu.Lock()
	h.conn = nil
	h.connMu.Unlock()
	for _, id := range callbackIDs {
		_ = conn.DomainEventDeregister(id)
	}
	_ = conn.UnregisterCloseCallback()
	conn.Close()
	h.closeTunnel()
	// Drain a stale "lost" signal so the next connection starts clean.
	select {
	case <-h.lost:
	default:
	}
}

// dial is the URI libvirt opens: opts.URI, or for an ssh URI the
// socket of a fresh ssh connection.
func (h *Hypervisor) dial(ctx context.Context) (string, error) {
	if h.sshErr != nil {
		return "", h.sshErr
	}
	if h.ssh == nil {
		return h.opts.URI, nil
	}
	t, err := h.ssh.Dial(ctx, !h.opts.ReadWrite)
	if err != nil {
		return "", err
	}
	h.tunnel = t
	return t.URI, nil
}

// closeTunnel ends the ssh connection of the last dial, if any.
func (h *Hypervisor) closeTunnel() {
	if h.tunnel != nil {
		h.tunnel.Close()
		h.tunnel = nil
	}
}

// serve keeps the cache in step with one live connection until the
// connection is lost (error) or ctx ends (nil).
func (h *Hypervisor) serve(ctx context.Context, conn *libvirt.Connect) error {
	if err := h.resync(ctx, conn, true); err != nil {
		return err
	}
	h.connMu.Lock()
	h.conn = conn
	h.connMu.Unlock()
	h.markStarted()

	ticker := time.NewTicker(h.opts.ResyncPeriod)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-h.lost:
			if alive, err := conn.IsAlive(); err != nil || !alive {
				return fmt.Errorf("connection to %s closed", h.opts.URI)
			}
			// Events overflowed on a live connection: start over.
			if err := h.resync(ctx, conn, true); err != nil {
				return err
			}
		case <-ticker.C:
			if err := h.resync(ctx, conn, false); err != nil {
				return err
			}
		case ev := <-h.raw:
			h.apply(ctx, conn, ev)
		}
	}
}

func (h *Hypervisor) markStarted() {
	select {
	case <-h.started:
	default:
		close(h.started)
	}
}
