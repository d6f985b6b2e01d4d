package netroutes

import (
	"errors"
	"fmt"
	"hash/maphash"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/labcloud/labcloud/metrics"
)

// VIPProtocol marks the load balancers' spread routes (shown as "proto 77"
// by `ip route`): one number apart from the pod-CIDR routes' DefaultProtocol,
// so each Manager lists and removes only its own.
const VIPProtocol netlink.RouteProtocol = 77

// Paths is a route with one or more next hops on the bridge: traffic to Dst
// is spread over Gateways by the kernel's multipath hash (per connection
// with net.ipv4.fib_multipath_hash_policy=1, per client address with the
// default 0). Gateways are kept sorted, so equal sets compare equal.
type Paths struct {
	Dst      netip.Prefix
	Gateways []netip.Addr
}

func (p Paths) String() string { return fmt.Sprintf("%s via %v", p.Dst, p.Gateways) }

// ReconcilePaths makes the Manager's routes exactly desired, each written
// as one route (multipath when it has several gateways) with a single
// replace, so a changed set of next hops never leaves a gap. It reads the
// kernel's routes, writes nothing for a route already in place, and removes
// owned routes to other destinations. It returns how many writes it made.
// Use a Manager of its own protocol (VIPProtocol): Reconcile would take
// these routes for stale.
func (m *Manager) ReconcilePaths(desired []Paths) (int, error) {
	want, err := wantPaths(desired)
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reconcilePaths(want)
}

// UpdatePaths is ReconcilePaths without reading the kernel: it writes what
// differs from the routes the Manager last put in place, as those stand
// after its last ReconcilePaths or UpdatePaths that had no error (without
// one, it reconciles). It cannot see routes someone else changed since;
// callers that write often use it between ReconcilePaths, whose dump
// allocates in proportion to every route and next hop.
func (m *Manager) UpdatePaths(desired []Paths) (int, error) {
	want, err := wantPaths(desired)
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.paths == nil {
		return m.reconcilePaths(want)
	}
	next := m.fingerprints(want)
	before := m.writes.Load()
	var errs []error
	for dst := range m.paths {
		if _, wanted := want[dst]; !wanted {
			errs = append(errs, m.delKey(m.pathsKey(dst)))
		}
	}
	var changed []netip.Prefix
	for _, dst := range sortedPrefixes(want) {
		if old, ok := m.paths[dst]; !ok || old != next[dst] {
			changed = append(changed, dst)
		}
	}
	if len(changed) > 0 { // the bridge is looked up only to write
		if link, err := m.bridge(); err != nil {
			errs = append(errs, err)
		} else {
			for _, dst := range changed {
				errs = append(errs, m.replacePaths(want[dst], link))
			}
		}
	}
	m.setPaths(next, errors.Join(errs...))
	return int(m.writes.Load() - before), errors.Join(errs...)
}

// wantPaths checks desired and keys it by destination, gateways sorted
// and without repeats. Gateways already so are used as they are, without
// a copy; others are sorted in a copy, leaving the caller's alone.
func wantPaths(desired []Paths) (map[netip.Prefix]Paths, error) {
	want := make(map[netip.Prefix]Paths, len(desired))
	var errs []error
	for _, p := range desired {
		if !sortedUnique(p.Gateways) {
			p.Gateways = slices.Clone(p.Gateways)
			slices.SortFunc(p.Gateways, netip.Addr.Compare)
			p.Gateways = slices.Compact(p.Gateways)
		}
		if err := checkPaths(p); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, dup := want[p.Dst]; dup {
			errs = append(errs, fmt.Errorf("route %s: destination listed twice", p))
			continue
		}
		want[p.Dst] = p
	}
	return want, errors.Join(errs...)
}

// sortedUnique says whether gws is in ascending order without repeats.
func sortedUnique(gws []netip.Addr) bool {
	for i := 1; i < len(gws); i++ {
		if gws[i-1].Compare(gws[i]) >= 0 {
			return false
		}
	}
	return true
}

// reconcilePaths is ReconcilePaths with m.mu held.
func (m *Manager) reconcilePaths(want map[netip.Prefix]Paths) (int, error) {
	m.paths = nil
	link, err := m.bridge()
	if err != nil {
		return 0, err
	}
	// Each route is reduced to its paths and delete key as the dump
	// streams in, rather than holding the whole dump at once.
	owned, err := dumpOwned(m, func(k netlink.Route) ownedPaths {
		p, ok := m.pathsFromKernel(k, link)
		return ownedPaths{paths: p, shaped: ok, key: keyOf(k)}
	})
	if err != nil {
		return 0, err
	}
	before := m.writes.Load()
	var errs []error
	have := map[netip.Prefix]bool{}
	for _, o := range owned {
		dst, ok := prefixFromIPNet(o.key.dst)
		p, wanted := want[dst]
		if ok && wanted && !have[dst] && o.shaped && o.paths.Dst == p.Dst && slices.Equal(o.paths.Gateways, p.Gateways) {
			have[dst] = true
			continue
		}
		if ok && wanted && !have[dst] && o.key.priority == m.cfg.Metric && o.key.tos == 0 {
			continue // same kernel key as the wanted route: the replace below rewrites it
		}
		errs = append(errs, m.delKey(o.key))
	}
	for _, dst := range sortedPrefixes(want) {
		if !have[dst] {
			errs = append(errs, m.replacePaths(want[dst], link))
		}
	}
	m.setPaths(m.fingerprints(want), errors.Join(errs...))
	return int(m.writes.Load() - before), errors.Join(errs...)
}

// setPaths records the fingerprints of the routes now in place, or forgets
// them after a failed write: the next UpdatePaths then reads the kernel.
func (m *Manager) setPaths(fingerprints map[netip.Prefix]uint64, err error) {
	m.paths = fingerprints
	if err != nil {
		m.paths = nil
	}
}

// fingerprints is each wanted route's fingerprint, by destination.
func (m *Manager) fingerprints(want map[netip.Prefix]Paths) map[netip.Prefix]uint64 {
	out := make(map[netip.Prefix]uint64, len(want))
	for dst, p := range want {
		out[dst] = m.fingerprint(p)
	}
	return out
}

// fingerprint stands for p's sorted gateways. Two sets with the same one
// (a chance of one in 2^64) would leave a route unwritten until the next
// ReconcilePaths.
func (m *Manager) fingerprint(p Paths) uint64 {
	var h maphash.Hash
	h.SetSeed(m.seed)
	for _, gw := range p.Gateways {
		b := gw.As16()
		h.Write(b[:])
	}
	return h.Sum64()
}

// replacePaths writes p with one replace.
func (m *Manager) replacePaths(p Paths, link netlink.Link) error {
	m.writes.Add(1)
	metrics.RouteWrites.WithLabelValues(metrics.OpReplace).Inc()
	if err := m.h.RouteReplace(m.pathsToKernel(p, link)); err != nil {
		return fmt.Errorf("replace route %s dev %s: %w", p, m.cfg.Bridge, err)
	}
	return nil
}

// pathsKey is the delete key of the route pathsToKernel writes to dst.
func (m *Manager) pathsKey(dst netip.Prefix) routeKey {
	return routeKey{dst: ipNet(dst), table: m.cfg.Table, priority: m.cfg.Metric, protocol: m.cfg.Protocol}
}

// ListPaths returns the Manager's routes as ReconcilePaths writes them
// (those in another shape are left out), sorted by destination.
func (m *Manager) ListPaths() ([]Paths, error) {
	return listOwned(m, m.pathsFromKernel, func(a, b Paths) int { return a.Dst.Addr().Compare(b.Dst.Addr()) })
}

// pathsToKernel is <dst> via <gw> (one gateway) or <dst> nexthop via <gw1>
// nexthop via <gw2> ... (several), on the bridge, with the Manager's
// protocol, table and metric.
func (m *Manager) pathsToKernel(p Paths, link netlink.Link) *netlink.Route {
	r := &netlink.Route{
		Dst:      ipNet(p.Dst),
		Protocol: m.cfg.Protocol,
		Table:    m.cfg.Table,
		Priority: m.cfg.Metric,
		Type:     unix.RTN_UNICAST,
	}
	if len(p.Gateways) == 1 {
		r.LinkIndex, r.Gw = link.Attrs().Index, p.Gateways[0].AsSlice()
		return r
	}
	for _, gw := range p.Gateways {
		r.MultiPath = append(r.MultiPath, &netlink.NexthopInfo{LinkIndex: link.Attrs().Index, Gw: gw.AsSlice()})
	}
	return r
}

// ownedPaths is a dumped route as ReconcilePaths keeps it.
type ownedPaths struct {
	paths  Paths // what pathsFromKernel read, if shaped
	shaped bool  // in the shape pathsToKernel writes
	key    routeKey
}

// pathsFromKernel reads an owned kernel route in the shape pathsToKernel
// writes, gateways sorted; ok is false for any other shape.
func (m *Manager) pathsFromKernel(k netlink.Route, link netlink.Link) (Paths, bool) {
	dst, ok := prefixFromIPNet(k.Dst)
	if !ok || k.Priority != m.cfg.Metric || k.Tos != 0 || k.Type != unix.RTN_UNICAST || k.Src != nil {
		return Paths{}, false
	}
	p := Paths{Dst: dst}
	hop := func(index int, gw net.IP) bool {
		a, ok := netip.AddrFromSlice(gw)
		p.Gateways = append(p.Gateways, a.Unmap())
		return ok && index == link.Attrs().Index
	}
	if len(k.MultiPath) == 0 && !hop(k.LinkIndex, k.Gw) {
		return Paths{}, false
	}
	for _, nh := range k.MultiPath {
		if nh.Flags != 0 && nh.Flags&unix.RTNH_F_LINKDOWN == 0 || !hop(nh.LinkIndex, nh.Gw) {
			return Paths{}, false
		}
	}
	slices.SortFunc(p.Gateways, netip.Addr.Compare)
	return p, true
}

func checkPaths(p Paths) error {
	if len(p.Gateways) == 0 {
		return fmt.Errorf("route %s: no gateway", p)
	}
	for _, gw := range p.Gateways {
		if err := checkRoute(Route{Dst: p.Dst, Gateway: gw}); err != nil {
			return err
		}
	}
	return nil
}

func sortedPrefixes[V any](m map[netip.Prefix]V) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(m))
	for p := range m {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return out
}
