package netroutes

import (
	"errors"
	"fmt"
	"hash/maphash"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/labcloud/labcloud/metrics"
)

// DefaultProtocol marks the routes labcloud owns (rtm_protocol, shown by
// `ip route` as "proto 76"; 76 is ASCII 'L'). It is outside the kernel's
// RTPROT_* values and /etc/iproute2/rt_protos (0-18, 42 babel, 99 openr,
// 186-192), FRR's numbers (11 zebra, 186-198), bird (12), calico (80) and
// kube-vip (248); cilium, systemd-networkd, NetworkManager and DHCP clients
// use the standard kernel/boot/static/dhcp/ra values. An unshared number is
// what lets List ignore everybody else's routes. (A daemon that flushes
// foreign routes, such as networkd's ManageForeignRoutes, is survived by
// rebuilding on the next Reconcile, not by borrowing its protocol.)
const DefaultProtocol netlink.RouteProtocol = 76

// DefaultMetric is the priority of labcloud's routes. The kernel keys a route
// by (table, dst, tos, priority): another route to the same destination with
// the same metric makes our exclusive add fail (EEXIST) and a replace would
// overwrite it. 3076 differs from the metrics routes are usually added with
// (0 for `ip route add` and static routes, 32 bird, 100-600 NetworkManager,
// 200+/1000+ dhcpcd, 1024 for IPv6 user routes, 256 for IPv6 connected
// routes), so labcloud's route coexists with a foreign one and, being the
// higher metric, loses to it: an operator's deliberate route wins.
const DefaultMetric = 3076

// dumpAttempts bounds retries of a route dump the kernel flagged as
// interrupted by a concurrent change (NLM_F_DUMP_INTR).
const dumpAttempts = 5

// Config says where labcloud's routes live and how they are marked.
type Config struct {
	Bridge   string                // the libvirt bridge, e.g. "virbr0"; required
	Protocol netlink.RouteProtocol // 0 means DefaultProtocol
	// Table holds the routes; 0 means main. Another table only takes effect
	// with an `ip rule` pointing at it, which labcloud does not install.
	Table  int
	Metric int // 0 means DefaultMetric
}

// Manager applies routes on the bridge with netlink. Its methods are safe for
// concurrent use; each one is a read-modify-write done under a lock.
type Manager struct {
	h      *netlink.Handle
	cfg    Config
	mu     sync.Mutex
	writes atomic.Uint64
	// paths are the routes ReconcilePaths or UpdatePaths last put in place
	// without error: each destination's gateways, as a fingerprint (a map
	// of 1000 routes of 16 next hops is half a megabyte kept, this one 40
	// kB); nil when not known. Guarded by mu.
	paths map[netip.Prefix]uint64
	seed  maphash.Seed
}

// Result says what Reconcile changed. A gateway change for a destination is
// applied as one replace and shows up in both lists.
type Result struct {
	Added, Removed []Route
}

// New returns a Manager that programs routes through h, which may be bound to
// another network namespace (netlink.NewHandleAt). It turns on strict
// checking of h's requests, so h should be the Manager's own. The bridge
// must exist.
func New(h *netlink.Handle, cfg Config) (*Manager, error) {
	if h == nil {
		return nil, errors.New("netroutes: nil netlink handle")
	}
	if cfg.Bridge == "" {
		return nil, errors.New("netroutes: Config.Bridge is empty")
	}
	if cfg.Protocol == 0 {
		cfg.Protocol = DefaultProtocol
	}
	if cfg.Table == 0 {
		cfg.Table = unix.RT_TABLE_MAIN
	}
	if cfg.Metric == 0 {
		cfg.Metric = DefaultMetric
	}
	// With strict checking the kernel filters route dumps by table and
	// protocol itself (Linux 4.20+): a dump carries our routes only, not
	// every route on the host (the pod-CIDR Manager's every 2 s would
	// otherwise decode each VIP's multipath route too). The same filter
	// runs in userspace, so a kernel that refuses the option answers alike.
	_ = h.SetStrictCheck(true)
	m := &Manager{h: h, cfg: cfg, seed: maphash.MakeSeed()}
	if _, err := m.bridge(); err != nil {
		return nil, err
	}
	return m, nil
}

// Writes counts the netlink route writes (add, replace, delete) attempted so
// far, so callers can check that a converged state costs nothing.
func (m *Manager) Writes() uint64 { return m.writes.Load() }

// Subnets returns the bridge's global-scope subnets, the input Desired needs.
func (m *Manager) Subnets() ([]netip.Prefix, error) {
	link, err := m.bridge()
	if err != nil {
		return nil, err
	}
	var addrs []netlink.Addr
	err = retryDump(func() (err error) {
		addrs, err = m.h.AddrList(link, netlink.FAMILY_ALL)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list addresses of bridge %q: %w", m.cfg.Bridge, err)
	}
	nets := make([]*net.IPNet, 0, len(addrs))
	for _, a := range addrs {
		if a.Scope == int(netlink.SCOPE_UNIVERSE) { // link-local addresses are no node's next hop
			nets = append(nets, a.IPNet)
		}
	}
	return subnetsOf(nets), nil
}

// Connected returns the subnets of every address on every link in the
// Manager's namespace, and of each point-to-point peer: what the host
// reaches directly, which no routed destination may overlap.
func (m *Manager) Connected() ([]netip.Prefix, error) { return Connected(m.h) }

// Connected is Manager.Connected in h's namespace, for a caller with no
// bridge (the BGP announcer).
func Connected(h *netlink.Handle) ([]netip.Prefix, error) {
	var addrs []netlink.Addr
	err := retryDump(func() (err error) {
		addrs, err = h.AddrList(nil, netlink.FAMILY_ALL)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list the host's addresses: %w", err)
	}
	nets := make([]*net.IPNet, 0, len(addrs))
	for _, a := range addrs {
		nets = append(nets, a.IPNet)
		if a.Peer != nil {
			nets = append(nets, a.Peer)
		}
	}
	return subnetsOf(nets), nil
}

// subnetsOf are the subnets of nets, masked, each once, in order.
func subnetsOf(nets []*net.IPNet) []netip.Prefix {
	var out []netip.Prefix
	for _, n := range nets {
		if p, ok := prefixFromIPNet(n); ok && !slices.Contains(out, p.Masked()) {
			out = append(out, p.Masked())
		}
	}
	return out
}

// List returns labcloud's routes: those with its protocol in its table, on
// the bridge, with its metric. Routes of any other protocol are never listed.
// Owned routes in another shape (an old bridge or metric) are not listed
// either; Ensure and Reconcile replace or remove them.
func (m *Manager) List() ([]Route, error) {
	return listOwned(m, m.fromKernel, compareRoutes)
}

// listOwned converts every owned route that read accepts, sorted by cmp.
func listOwned[T any](m *Manager, read func(netlink.Route, netlink.Link) (T, bool), cmp func(a, b T) int) ([]T, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	link, err := m.bridge()
	if err != nil {
		return nil, err
	}
	owned, err := m.owned()
	if err != nil {
		return nil, err
	}
	var out []T
	for _, k := range owned {
		if v, ok := read(k, link); ok {
			out = append(out, v)
		}
	}
	slices.SortFunc(out, cmp)
	return out, nil
}

// Ensure makes r labcloud's only route to r.Dst. It writes nothing when the
// route is already in place.
func (m *Manager) Ensure(r Route) error {
	if err := validate([]Route{r}); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	link, err := m.bridge()
	if err != nil {
		return err
	}
	owned, err := m.owned()
	if err != nil {
		return err
	}
	owned = slices.DeleteFunc(owned, func(k netlink.Route) bool { return !sameDst(k, r.Dst) })
	_, err = m.converge(link, []Route{r}, owned)
	return err
}

// Remove deletes labcloud's route to r.Dst via r.Gateway (any gateway when
// r.Gateway is the zero Addr). A missing route is not an error.
func (m *Manager) Remove(r Route) error {
	if !r.Dst.IsValid() || r.Dst != r.Dst.Masked() {
		return fmt.Errorf("remove route %s: destination must be a valid, masked prefix", r)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	owned, err := m.owned()
	if err != nil {
		return err
	}
	var errs []error
	for _, k := range owned {
		if !sameDst(k, r.Dst) || (r.Gateway.IsValid() && !sameGateway(k, r.Gateway)) {
			continue
		}
		errs = append(errs, m.del(k))
	}
	return errors.Join(errs...)
}

// Reconcile makes labcloud's routes exactly desired: missing routes are
// added, changed gateways replaced, stale owned routes removed. Foreign routes
// are never touched. It carries on past a failing route and returns all
// failures joined, with Result listing what was applied.
func (m *Manager) Reconcile(desired []Route) (Result, error) {
	if err := validate(desired); err != nil {
		return Result{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	link, err := m.bridge()
	if err != nil {
		return Result{}, err
	}
	owned, err := m.owned()
	if err != nil {
		return Result{}, err
	}
	return m.converge(link, desired, owned)
}

// converge turns the owned kernel routes into desired. Owned routes that are
// not in labcloud's shape (another device or metric, multipath) are stale.
// Additions come before deletions (make before break); a deletion with the
// same kernel key as an addition becomes one atomic replace instead.
func (m *Manager) converge(link netlink.Link, desired []Route, owned []netlink.Route) (Result, error) {
	var actual []Route
	kernel := map[Route]netlink.Route{}
	var stale []netlink.Route
	for _, k := range owned {
		r, ok := m.fromKernel(k, link)
		if _, dup := kernel[r]; !ok || dup {
			stale = append(stale, k) // misshaped, or a second copy of one route
			continue
		}
		kernel[r] = k
		actual = append(actual, r)
	}
	add, remove := Diff(desired, actual)
	for _, r := range remove {
		stale = append(stale, kernel[r])
	}

	// Stale routes sharing an addition's key: (table, dst, tos 0, metric).
	sameKey := map[netip.Prefix]int{}
	for i, k := range stale {
		if p, ok := prefixFromIPNet(k.Dst); ok && k.Priority == m.cfg.Metric && k.Tos == 0 {
			sameKey[p] = i
		}
	}

	var res Result
	var errs []error
	replaced := map[int]bool{}
	for _, r := range add {
		if i, ok := sameKey[r.Dst]; ok {
			replaced[i] = true
			if err := m.write(r, link, metrics.OpReplace, m.h.RouteReplace); err != nil {
				errs = append(errs, err)
				continue
			}
			if old, ok := m.fromKernel(stale[i], link); ok {
				res.Removed = append(res.Removed, old)
			}
			res.Added = append(res.Added, r)
			continue
		}
		if err := m.write(r, link, metrics.OpAdd, m.h.RouteAdd); err != nil {
			errs = append(errs, err)
			continue
		}
		res.Added = append(res.Added, r)
	}
	for i, k := range stale {
		if replaced[i] {
			continue
		}
		if err := m.del(k); err != nil {
			errs = append(errs, err)
			continue
		}
		if r, ok := m.fromKernel(k, link); ok {
			res.Removed = append(res.Removed, r)
		}
	}
	return res, errors.Join(errs...)
}

// write sends one add or replace of r; verb is metrics.OpAdd or OpReplace.
func (m *Manager) write(r Route, link netlink.Link, verb string, op func(*netlink.Route) error) error {
	m.writes.Add(1)
	metrics.RouteWrites.WithLabelValues(verb).Inc()
	err := op(m.toKernel(r, link))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EEXIST):
		// Only a foreign route can hold our key: owned ones were listed.
		return fmt.Errorf("%s route %s dev %s metric %d: a route not owned by labcloud has the same table and metric; set a different Metric or Table: %w",
			verb, r, m.cfg.Bridge, m.cfg.Metric, err)
	default:
		return fmt.Errorf("%s route %s dev %s: %w", verb, r, m.cfg.Bridge, err)
	}
}

// del deletes one owned kernel route. The request carries our protocol, so
// the kernel itself refuses to delete a foreign route that merely looks alike.
func (m *Manager) del(k netlink.Route) error {
	return m.delKey(keyOf(k))
}

// delKey deletes the owned route with key k.
func (m *Manager) delKey(k routeKey) error {
	req := &netlink.Route{Dst: k.dst, Gw: k.gw, LinkIndex: k.linkIndex,
		Table: k.table, Protocol: k.protocol, Priority: k.priority, Tos: k.tos}
	m.writes.Add(1)
	metrics.RouteWrites.WithLabelValues(metrics.OpDelete).Inc()
	err := m.h.RouteDel(req)
	if err == nil || errors.Is(err, unix.ESRCH) {
		return nil // ESRCH: already gone, which is what we wanted
	}
	return fmt.Errorf("delete route %s via %s (proto %d): %w", k.dst, k.gw, k.protocol, err)
}

// routeKey is what a delete of a route carries: the kernel's key for it
// and its gateway, not its next hops.
type routeKey struct {
	dst                             *net.IPNet
	gw                              net.IP
	linkIndex, table, priority, tos int
	protocol                        netlink.RouteProtocol
}

func keyOf(k netlink.Route) routeKey {
	return routeKey{dst: k.Dst, gw: k.Gw, linkIndex: k.LinkIndex, table: k.Table,
		priority: k.Priority, tos: k.Tos, protocol: k.Protocol}
}

// bridge looks the bridge up on every call: libvirt recreates it (with a new
// index) when a network is restarted.
func (m *Manager) bridge() (netlink.Link, error) {
	link, err := m.h.LinkByName(m.cfg.Bridge)
	if err != nil {
		return nil, fmt.Errorf("bridge %q: %w", m.cfg.Bridge, err)
	}
	return link, nil
}

// owned dumps the routes in our table carrying our protocol, both families.
func (m *Manager) owned() ([]netlink.Route, error) {
	return dumpOwned(m, func(k netlink.Route) netlink.Route { return k })
}

// dumpOwned dumps the routes in our table carrying our protocol, both
// families, and keeps what read makes of each: a caller that needs less
// than the whole route (next hops are a slice of pointers each) lets the
// rest go as the dump streams in, instead of holding every route at once.
func dumpOwned[T any](m *Manager, read func(netlink.Route) T) ([]T, error) {
	filter := &netlink.Route{Table: m.cfg.Table, Protocol: m.cfg.Protocol}
	mask := netlink.RT_FILTER_TABLE | netlink.RT_FILTER_PROTOCOL
	var all []T
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		n := len(all)
		err := retryDump(func() error {
			all = all[:n] // an interrupted dump starts over
			return m.h.RouteListFilteredIter(fam, filter, mask, func(k netlink.Route) bool {
				all = append(all, read(k))
				return true
			})
		})
		if errors.Is(err, unix.ENOENT) {
			all = all[:n] // strictly checked: the table does not exist yet, so holds nothing
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list routes with proto %d in table %d: %w", m.cfg.Protocol, m.cfg.Table, err)
		}
	}
	return all, nil
}

// retryDump reruns a dump the kernel marked as interrupted, whose result may
// be inconsistent, a few times before giving up.
func retryDump(dump func() error) error {
	var err error
	for range dumpAttempts {
		if err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return err
		}
	}
	return fmt.Errorf("%d attempts: %w", dumpAttempts, err)
}
