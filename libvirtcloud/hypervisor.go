package libvirtcloud

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"libvirt.org/go/libvirt"

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
	// mac → addresses. Defaults to the netlink neighbour table of the
	// current namespace, without permanent entries.
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
	agent    map[string]agentAnswer // uuid → addresses from the guest agent
	synced   bool                   // the cache reflects a full listing

	neighMu sync.Mutex // one read of the neighbour table at a time
	neigh   map[string][]netip.Addr
	neighAt time.Time

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
}

// Open starts maintaining a connection to opts.URI until ctx ends. It does
// not wait for the hypervisor: lookups fail with ErrUnavailable until it
// answers. WaitSynced waits for the first full listing.
func Open(ctx context.Context, opts Options) (*Hypervisor, error) {
	if err := startEventLoop(); err != nil {
		return nil, err
	}
	if opts.ResyncPeriod <= 0 {
		opts.ResyncPeriod = 5 * time.Minute
	}
	if opts.Neighbours == nil {
		opts.Neighbours = func() (map[string][]netip.Addr, error) { return neighbourTable(&netlink.Handle{}) }
	}
	h := &Hypervisor{
		opts:    opts,
		domains: newIndex(),
		leases:  map[string][]netip.Addr{},
		agent:   map[string]agentAnswer{},
		raw:     make(chan rawEvent, 4096),
		lost:    make(chan struct{}, 1),
		started: make(chan struct{}),
		stopped: make(chan struct{}),
	}
	go func() {
		defer close(h.stopped)
		h.run(ctx)
	}()
	return h, nil
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
	backoff := wait.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.1, Cap: 15 * time.Second, Steps: 1 << 30}
	delay := time.Duration(0)
	connected := false // once: later connections are reconnects
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		conn, callbackIDs, err := h.connect()
		if err != nil {
			delay = backoff.Step()
			log.Error(err, "Cannot connect to hypervisor; retrying", "in", delay)
			continue
		}
		log.Info("Connected to hypervisor")
		if connected {
			metrics.LibvirtReconnects.WithLabelValues(h.opts.Zone).Inc()
		}
		connected = true
		backoff = wait.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.1, Cap: 15 * time.Second, Steps: 1 << 30}
		delay = 0
		err = h.serve(ctx, conn)
		h.disconnect(conn, callbackIDs)
		if err != nil {
			log.Error(err, "Lost hypervisor connection; reconnecting")
		}
	}
}

func (h *Hypervisor) connect() (*libvirt.Connect, []int, error) {
	var (
		conn *libvirt.Connect
		err  error
	)
	start := time.Now()
	if h.opts.ReadWrite {
		conn, err = libvirt.NewConnect(h.opts.URI)
	} else {
		conn, err = libvirt.NewConnectReadOnly(h.opts.URI)
	}
	h.called("Connect", start)
	if err != nil {
		return nil, nil, fmt.Errorf("connect %s: %w", h.opts.URI, err)
	}
	fail := func(what string, err error) (*libvirt.Connect, []int, error) {
		conn.Close()
		return nil, nil, fmt.Errorf("%s on %s: %w", what, h.opts.URI, err)
	}
	// Keepalive only exists on remote connections (the test driver says
	// it is unsupported); a dead daemon is then noticed within ~15 s.
	start = time.Now()
	err = conn.SetKeepAlive(5, 3)
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
	// Drain a stale "lost" signal so the next connection starts clean.
	select {
	case <-h.lost:
	default:
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

// resync rebuilds the domain and lease caches from a listing and publishes
// the differences as events. The listing carries every domain's state in
// one call; a domain's definition is read again only when it is new, its
// state changed, or full is set (a new connection, events lost): definitions
// otherwise change with events (defined, started, device added or removed)
// that refresh them. An unchanged host costs one call, plus the leases.
func (h *Hypervisor) resync(ctx context.Context, conn *libvirt.Connect, full bool) error {
	start := time.Now()
	stats, err := conn.GetAllDomainStats(nil, libvirt.DOMAIN_STATS_STATE, 0)
	h.called("GetAllDomainStats", start)
	if err != nil {
		return fmt.Errorf("list domains on %s: %w", h.opts.URI, err)
	}
	defer func() {
		for i := range stats {
			stats[i].Domain.Free()
		}
	}()
	h.mu.RLock()
	cached := h.domains
	h.mu.RUnlock()
	fresh := make([]Domain, 0, len(stats))
	for i := range stats {
		st := stats[i]
		if st.Domain == nil || st.State == nil || !st.State.StateSet {
			continue
		}
		state := stateFromLibvirt(libvirt.DomainState(st.State.State))
		uuid, err := st.Domain.GetUUIDString() // local
		if err != nil {
			continue
		}
		if prev, ok := cached.byUUID[strings.ToLower(uuid)]; ok && !full && prev.State == state {
			fresh = append(fresh, prev)
			continue
		}
		d, err := h.describeAs(st.Domain, state)
		if isNoDomain(err) {
			continue // undefined while we listed
		}
		if err != nil {
			return err
		}
		fresh = append(fresh, d)
	}
	leases, leaseErr := h.readLeases(conn)

	h.mu.Lock()
	old := h.domains
	h.domains = newIndex()
	var changed []Event
	now := time.Now()
	for _, d := range fresh {
		prev, had := old.byUUID[d.UUID]
		d.carryOver(prev, had, now)
		h.domains.put(d)
		if !had || prev.State != d.State {
			changed = append(changed, Event{Domain: d})
		}
	}
	for u, d := range old.byUUID {
		if _, still := h.domains.byUUID[u]; !still {
			changed = append(changed, Event{Domain: d, Removed: true})
		}
	}
	if leaseErr == nil {
		h.leases, h.leasesAt = leases, time.Now()
	}
	h.agent = map[string]agentAnswer{}
	h.synced = true
	h.cached()
	h.mu.Unlock()

	if leaseErr != nil {
		klog.FromContext(ctx).Error(leaseErr, "Cannot read DHCP leases; keeping the previous ones", "hypervisor", h.opts.URI)
	}
	for _, e := range changed {
		h.subs.publish(e)
	}
	return nil
}

// describe reads one domain's state and definition (two libvirt calls).
func (h *Hypervisor) describe(dom *libvirt.Domain) (Domain, error) {
	start := time.Now()
	st, _, err := dom.GetState()
	h.called("GetState", start)
	if err != nil {
		return Domain{}, fmt.Errorf("domain state on %s: %w", h.opts.URI, err)
	}
	return h.describeAs(dom, stateFromLibvirt(st))
}

// describeAs reads one domain's definition (one libvirt call); its state
// is known.
func (h *Hypervisor) describeAs(dom *libvirt.Domain, state State) (Domain, error) {
	start := time.Now()
	desc, err := dom.GetXMLDesc(0)
	h.called("GetXMLDesc", start)
	if err != nil {
		return Domain{}, fmt.Errorf("domain XML on %s: %w", h.opts.URI, err)
	}
	d, err := parseDomainXML(desc)
	if err != nil {
		return Domain{}, fmt.Errorf("%s: %w", h.opts.URI, err)
	}
	d.State = state
	d.Hypervisor = h.opts.Zone
	return d, nil
}

// apply folds one lifecycle event into the cache. The state implied by the
// event is published first, so that subscribers (VIP failover) react
// without waiting for the follow-up libvirt calls.
func (h *Hypervisor) apply(ctx context.Context, conn *libvirt.Connect, ev rawEvent) {
	h.mu.Lock()
	d, known := h.domains.byUUID[ev.uuid]
	delete(h.agent, ev.uuid)
	if known {
		if st, ok := stateFromEvent(ev.event, ev.detail); ok && st != d.State {
			prev := d
			d.State = st
			d.carryOver(prev, true, time.Now())
			if st.Down() && !prev.State.Down() {
				d.DownEventAt = ev.at
			}
			h.domains.put(d)
			h.mu.Unlock()
			h.subs.publish(Event{Domain: d})
			h.mu.Lock()
		}
		if ev.event == libvirt.DOMAIN_EVENT_UNDEFINED {
			h.domains.remove(ev.uuid)
			h.cached()
			h.mu.Unlock()
			h.subs.publish(Event{Domain: d, Removed: true})
			return
		}
	}
	h.mu.Unlock()

	// Refresh the definition: it changes on define and start (bridge names),
	// and a transient domain disappears on stop without an undefine event.
	start := time.Now()
	dom, err := conn.LookupDomainByUUIDString(ev.uuid)
	h.called("LookupDomainByUUIDString", start)
	if isNoDomain(err) {
		h.mu.Lock()
		old, had := h.domains.remove(ev.uuid)
		h.cached()
		h.mu.Unlock()
		if had {
			h.subs.publish(Event{Domain: old, Removed: true})
		}
		return
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot refresh domain after event", "uuid", ev.uuid, "hypervisor", h.opts.URI)
		return
	}
	fresh, err := h.describe(dom)
	dom.Free()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot refresh domain after event", "uuid", ev.uuid, "hypervisor", h.opts.URI)
		return
	}
	h.mu.Lock()
	prev, had := h.domains.byUUID[fresh.UUID]
	fresh.carryOver(prev, had, time.Now())
	if had && fresh.State.Down() && !prev.State.Down() {
		// An event that implies no state (QEMU's SHUTDOWN as its process
		// is killed) and a refresh that finds the domain down.
		fresh.DownEventAt = ev.at
	}
	h.domains.put(fresh)
	h.cached()
	h.mu.Unlock()
	if !had || prev.State != fresh.State {
		h.subs.publish(Event{Domain: fresh})
	}
}

// stateFromEvent is the state a lifecycle event implies, if any.
func stateFromEvent(ev libvirt.DomainEventType, detail int) (State, bool) {
	switch ev {
	case libvirt.DOMAIN_EVENT_STARTED, libvirt.DOMAIN_EVENT_RESUMED:
		return StateRunning, true
	case libvirt.DOMAIN_EVENT_SUSPENDED, libvirt.DOMAIN_EVENT_PMSUSPENDED:
		return StatePaused, true
	case libvirt.DOMAIN_EVENT_CRASHED:
		return StateCrashed, true
	case libvirt.DOMAIN_EVENT_STOPPED:
		if libvirt.DomainEventStoppedDetailType(detail) == libvirt.DOMAIN_EVENT_STOPPED_CRASHED ||
			libvirt.DomainEventStoppedDetailType(detail) == libvirt.DOMAIN_EVENT_STOPPED_FAILED {
			return StateCrashed, true
		}
		return StateShutOff, true
	}
	return StateUnknown, false
}

// withConn runs f with the live connection, or fails with ErrUnavailable.
func (h *Hypervisor) withConn(f func(*libvirt.Connect) error) error {
	h.connMu.RLock()
	defer h.connMu.RUnlock()
	if h.conn == nil {
		return fmt.Errorf("%s: %w", h.opts.URI, ErrUnavailable)
	}
	return f(h.conn)
}

// DomainByUUID returns the domain with this UUID: from the cache, else by
// asking the hypervisor, so ErrNotFound is always the hypervisor's answer.
func (h *Hypervisor) DomainByUUID(uuid string) (Domain, error) {
	uuid = strings.ToLower(uuid)
	if !h.Connected() {
		return Domain{}, fmt.Errorf("domain %s on %s: %w", uuid, h.opts.URI, ErrUnavailable)
	}
	h.mu.RLock()
	d, ok := h.domains.byUUID[uuid]
	h.mu.RUnlock()
	if ok {
		return d, nil
	}
	return h.lookup(fmt.Sprintf("uuid %s", uuid), "LookupDomainByUUIDString", func(c *libvirt.Connect) (*libvirt.Domain, error) {
		return c.LookupDomainByUUIDString(uuid)
	})
}

// DomainByName is DomainByUUID for a domain name.
func (h *Hypervisor) DomainByName(name string) (Domain, error) {
	if !h.Connected() {
		return Domain{}, fmt.Errorf("domain %q on %s: %w", name, h.opts.URI, ErrUnavailable)
	}
	h.mu.RLock()
	d, ok := h.domains.byNameLookup(name)
	h.mu.RUnlock()
	if ok {
		return d, nil
	}
	return h.lookup(fmt.Sprintf("name %q", name), "LookupDomainByName", func(c *libvirt.Connect) (*libvirt.Domain, error) {
		return c.LookupDomainByName(name)
	})
}

// lookup asks the hypervisor for a domain the cache does not hold (with
// find, the libvirt call named call) and caches the answer.
func (h *Hypervisor) lookup(what, call string, find func(*libvirt.Connect) (*libvirt.Domain, error)) (Domain, error) {
	var d Domain
	err := h.withConn(func(c *libvirt.Connect) error {
		start := time.Now()
		dom, err := find(c)
		h.called(call, start)
		if err != nil {
			return err
		}
		defer dom.Free()
		d, err = h.describe(dom)
		return err
	})
	switch {
	case isNoDomain(err):
		return Domain{}, fmt.Errorf("domain with %s on %s: %w", what, h.opts.URI, ErrNotFound)
	case errors.Is(err, ErrUnavailable):
		return Domain{}, err
	case err != nil:
		return Domain{}, fmt.Errorf("domain with %s on %s: %w: %w", what, h.opts.URI, ErrUnavailable, err)
	}
	h.mu.Lock()
	_, had := h.domains.put(d)
	h.cached()
	h.mu.Unlock()
	if !had {
		h.subs.publish(Event{Domain: d})
	}
	return d, nil
}

// Domains returns a snapshot of every cached domain.
func (h *Hypervisor) Domains() []Domain {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]Domain, 0, len(h.domains.byUUID))
	for _, d := range h.domains.byUUID {
		out = append(out, d)
	}
	return out
}

// Subscribe returns a channel of domain changes (state changes, additions,
// removals) and a function that ends the subscription.
func (h *Hypervisor) Subscribe() (<-chan Event, func()) { return h.subs.subscribe() }

func isNoDomain(err error) bool {
	var lerr libvirt.Error
	return errors.As(err, &lerr) && lerr.Code == libvirt.ERR_NO_DOMAIN
}

func isUnsupported(err error) bool {
	var lerr libvirt.Error
	return errors.As(err, &lerr) && (lerr.Code == libvirt.ERR_NO_SUPPORT || lerr.Code == libvirt.ERR_OPERATION_UNSUPPORTED)
}
