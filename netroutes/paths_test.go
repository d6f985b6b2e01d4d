package netroutes

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// kernelHops is the gateways of the one route to dst, sorted, and its
// protocol; it fails the test when there is not exactly one.
func kernelHops(t *testing.T, n *testNS, dst string) []string {
	t.Helper()
	routes := kernelRoutes(t, n, dst)
	if len(routes) != 1 {
		t.Fatalf("routes to %s: %v, want exactly one", dst, routes)
	}
	k := routes[0]
	if k.Protocol != VIPProtocol {
		t.Errorf("route to %s has proto %d, want %d", dst, k.Protocol, VIPProtocol)
	}
	var out []string
	if len(k.MultiPath) == 0 {
		out = append(out, k.Gw.String())
	}
	for _, nh := range k.MultiPath {
		out = append(out, nh.Gw.String())
	}
	slices.Sort(out)
	return out
}

func paths(dst string, gws ...string) Paths {
	p := Paths{Dst: pfx(dst)}
	for _, g := range gws {
		p.Gateways = append(p.Gateways, addr(g))
	}
	return p
}

func mustReconcilePaths(t *testing.T, m *Manager, desired ...Paths) int {
	t.Helper()
	writes, err := m.ReconcilePaths(desired)
	if err != nil {
		t.Fatalf("ReconcilePaths(%v): %v", desired, err)
	}
	return writes
}

func TestReconcilePathsSpreadsAndNarrows(t *testing.T) {
	n, m := newLab(t, Config{Protocol: VIPProtocol})
	const vip = "192.168.100.200/32"

	if w := mustReconcilePaths(t, m, paths(vip, "192.168.100.13", "192.168.100.11", "192.168.100.12")); w != 1 {
		t.Errorf("first install: %d writes, want 1", w)
	}
	if got, want := kernelHops(t, n, vip), []string{"192.168.100.11", "192.168.100.12", "192.168.100.13"}; !slices.Equal(got, want) {
		t.Errorf("next hops = %v, want %v", got, want)
	}
	if w := mustReconcilePaths(t, m, paths(vip, "192.168.100.12", "192.168.100.11", "192.168.100.13")); w != 0 {
		t.Errorf("same set in another order: %d writes, want 0", w)
	}
	if got, err := m.ListPaths(); err != nil || len(got) != 1 || got[0].String() != "192.168.100.200/32 via [192.168.100.11 192.168.100.12 192.168.100.13]" {
		t.Errorf("ListPaths = %v, %v", got, err)
	}

	// A node leaves: one replace, never a moment without the route.
	if w := mustReconcilePaths(t, m, paths(vip, "192.168.100.11", "192.168.100.13")); w != 1 {
		t.Errorf("narrowing: %d writes, want 1", w)
	}
	if got, want := kernelHops(t, n, vip), []string{"192.168.100.11", "192.168.100.13"}; !slices.Equal(got, want) {
		t.Errorf("next hops = %v, want %v", got, want)
	}

	// Down to the one node a ClientIP-affinity Service keeps.
	if w := mustReconcilePaths(t, m, paths(vip, "192.168.100.12")); w != 1 {
		t.Errorf("single next hop: %d writes, want 1", w)
	}
	if got, want := kernelHops(t, n, vip), []string{"192.168.100.12"}; !slices.Equal(got, want) {
		t.Errorf("next hops = %v, want %v", got, want)
	}
	if w := mustReconcilePaths(t, m, paths(vip, "192.168.100.12")); w != 0 {
		t.Errorf("single next hop again: %d writes, want 0", w)
	}
}

func TestReconcilePathsRemovesOnlyItsOwn(t *testing.T) {
	n, m := newLab(t, Config{Protocol: VIPProtocol})
	pods, err := New(n.handle(t), Config{Bridge: labBridge})
	if err != nil {
		t.Fatal(err)
	}
	mustReconcile(t, pods, []Route{rt("10.244.1.0/24", "192.168.100.11")})
	addForeign(t, n, "192.168.100.201/32", "192.168.100.12", 4, 0) // an operator's static route

	mustReconcilePaths(t, m, paths("192.168.100.200/32", "192.168.100.11", "192.168.100.12"))
	if w := mustReconcilePaths(t, m); w != 1 {
		t.Errorf("withdrawing the VIP: %d writes, want 1", w)
	}
	if got := kernelRoutes(t, n, "192.168.100.200/32"); len(got) != 0 {
		t.Errorf("VIP route still there: %v", got)
	}
	if got := kernelRoutes(t, n, "10.244.1.0/24"); len(got) != 1 || got[0].Protocol != DefaultProtocol {
		t.Errorf("pod-CIDR route of the other Manager = %v, want it untouched", got)
	}
	if got := kernelRoutes(t, n, "192.168.100.201/32"); len(got) != 1 {
		t.Errorf("foreign route = %v, want it untouched", got)
	}
	// And the pod-CIDR Manager leaves the VIP routes alone in turn.
	mustReconcilePaths(t, m, paths("192.168.100.200/32", "192.168.100.11", "192.168.100.12"))
	mustReconcile(t, pods, []Route{rt("10.244.1.0/24", "192.168.100.11")})
	if got := kernelHops(t, n, "192.168.100.200/32"); len(got) != 2 {
		t.Errorf("VIP route after the pod-CIDR Manager's reconcile: %v", got)
	}
}

func TestReconcilePathsNamesBadInput(t *testing.T) {
	_, m := newLab(t, Config{Protocol: VIPProtocol})
	for _, tc := range []struct {
		p    Paths
		want string
	}{
		{paths("192.168.100.200/32"), "no gateway"},
		{paths("192.168.100.200/32", "fd00:100::11"), "different families"},
		{Paths{Dst: netip.MustParsePrefix("192.168.100.200/24"), Gateways: []netip.Addr{addr("192.168.100.11")}}, "host bits"},
	} {
		if _, err := m.ReconcilePaths([]Paths{tc.p}); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.p.Dst.String()) {
			t.Errorf("ReconcilePaths(%v) error = %v, want one naming %s and saying %q", tc.p, err, tc.p.Dst, tc.want)
		}
	}
	if _, err := m.ReconcilePaths([]Paths{paths("192.168.100.200/32", "192.168.100.11"), paths("192.168.100.200/32", "192.168.100.12")}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("a destination listed twice: error = %v", err)
	}
}

func mustUpdatePaths(t *testing.T, m *Manager, desired ...Paths) int {
	t.Helper()
	writes, err := m.UpdatePaths(desired)
	if err != nil {
		t.Fatalf("UpdatePaths(%v): %v", desired, err)
	}
	return writes
}

func TestUpdatePathsWritesWhatChangedSinceItsLastWrite(t *testing.T) {
	n, m := newLab(t, Config{Protocol: VIPProtocol})
	const vip1, vip2, stale = "192.168.100.200/32", "192.168.100.201/32", "192.168.100.202/32"
	addForeign(t, n, stale, "192.168.100.11", VIPProtocol, DefaultMetric) // left by an earlier run

	// Nothing known yet: it reads the kernel, as ReconcilePaths does.
	if w := mustUpdatePaths(t, m, paths(vip1, "192.168.100.11", "192.168.100.12"), paths(vip2, "192.168.100.13")); w != 3 {
		t.Errorf("first update: %d writes, want 3 (two routes, one stale removed)", w)
	}
	if got := kernelRoutes(t, n, stale); len(got) != 0 {
		t.Errorf("stale owned route still there: %v", got)
	}
	if w := mustUpdatePaths(t, m, paths(vip2, "192.168.100.13"), paths(vip1, "192.168.100.12", "192.168.100.11")); w != 0 {
		t.Errorf("same routes again: %d writes, want 0", w)
	}
	// One route narrowed, one withdrawn: one write each.
	if w := mustUpdatePaths(t, m, paths(vip1, "192.168.100.12")); w != 2 {
		t.Errorf("narrow one, withdraw one: %d writes, want 2", w)
	}
	if got, want := kernelHops(t, n, vip1), []string{"192.168.100.12"}; !slices.Equal(got, want) {
		t.Errorf("next hops of %s = %v, want %v", vip1, got, want)
	}
	if got := kernelRoutes(t, n, vip2); len(got) != 0 {
		t.Errorf("withdrawn route still there: %v", got)
	}

	// A route someone else deleted is only seen by ReconcilePaths.
	for _, r := range kernelRoutes(t, n, vip1) {
		if err := n.h.RouteDel(&r); err != nil {
			t.Fatal(err)
		}
	}
	if w := mustUpdatePaths(t, m, paths(vip1, "192.168.100.12")); w != 0 {
		t.Errorf("update after a foreign delete: %d writes, want 0 (it does not read the kernel)", w)
	}
	if w := mustReconcilePaths(t, m, paths(vip1, "192.168.100.12")); w != 1 {
		t.Errorf("reconcile after a foreign delete: %d writes, want 1", w)
	}

	// A failed write makes the next update read the kernel again.
	if _, err := m.UpdatePaths([]Paths{paths(vip1, "192.168.100.12"), paths(vip2, "10.99.0.1")}); err == nil || !strings.Contains(err.Error(), vip2) {
		t.Fatalf("update with a gateway off the bridge: error = %v, want one naming %s", err, vip2)
	}
	addForeign(t, n, stale, "192.168.100.11", VIPProtocol, DefaultMetric)
	if w := mustUpdatePaths(t, m, paths(vip1, "192.168.100.12")); w != 1 {
		t.Errorf("update after a failed write: %d writes, want 1 (the stale route removed)", w)
	}
	if got := kernelRoutes(t, n, stale); len(got) != 0 {
		t.Errorf("stale owned route still there after the update that followed a failure: %v", got)
	}
}

// wantPaths takes gateways already sorted and unique as they are, and sorts
// any others in a copy: the caller's slices are never changed.
func TestWantPathsSortsInACopyOnly(t *testing.T) {
	a, b, c := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	sorted := []netip.Addr{a, b, c}
	unsorted := []netip.Addr{c, a, c, b}
	dst1, dst2 := netip.MustParsePrefix("10.9.0.1/32"), netip.MustParsePrefix("10.9.0.2/32")
	want, err := wantPaths([]Paths{{Dst: dst1, Gateways: sorted}, {Dst: dst2, Gateways: unsorted}})
	if err != nil {
		t.Fatal(err)
	}
	if got := want[dst2].Gateways; !slices.Equal(got, sorted) {
		t.Errorf("gateways %v became %v, want %v", unsorted, got, sorted)
	}
	if !slices.Equal(unsorted, []netip.Addr{c, a, c, b}) {
		t.Errorf("the caller's gateways were changed to %v", unsorted)
	}
	if &want[dst1].Gateways[0] != &sorted[0] {
		t.Error("sorted gateways were copied")
	}
}

// IPv6 VIPs are spread like IPv4 ones: the kernel keeps an IPv6 multipath
// route as one route with several next hops, which is read back, narrowed
// with one replace and withdrawn with one delete, as for IPv4.
func TestPathsIPv6(t *testing.T) {
	n, m := newLab(t, Config{Protocol: VIPProtocol})
	const vip = "fd00:100::200/128"

	if w := mustReconcilePaths(t, m, paths(vip, "fd00:100::13", "fd00:100::11", "fd00:100::12")); w != 1 {
		t.Errorf("first install: %d writes, want 1", w)
	}
	if got, want := kernelHops(t, n, vip), []string{"fd00:100::11", "fd00:100::12", "fd00:100::13"}; !slices.Equal(got, want) {
		t.Errorf("next hops = %v, want %v", got, want)
	}
	if w := mustReconcilePaths(t, m, paths(vip, "fd00:100::12", "fd00:100::11", "fd00:100::13")); w != 0 {
		t.Errorf("same set in another order: %d writes, want 0 (the kernel's route read back as written)", w)
	}
	if got, err := m.ListPaths(); err != nil || len(got) != 1 || got[0].String() != "fd00:100::200/128 via [fd00:100::11 fd00:100::12 fd00:100::13]" {
		t.Errorf("ListPaths = %v, %v", got, err)
	}
	if w := mustReconcilePaths(t, m, paths(vip, "fd00:100::11", "fd00:100::13")); w != 1 {
		t.Errorf("narrowing: %d writes, want 1", w)
	}
	if got, want := kernelHops(t, n, vip), []string{"fd00:100::11", "fd00:100::13"}; !slices.Equal(got, want) {
		t.Errorf("next hops after narrowing = %v, want %v", got, want)
	}
	if w := mustReconcilePaths(t, m, paths(vip, "fd00:100::12")); w != 1 {
		t.Errorf("single next hop: %d writes, want 1", w)
	}
	if got, want := kernelHops(t, n, vip), []string{"fd00:100::12"}; !slices.Equal(got, want) {
		t.Errorf("next hops = %v, want %v", got, want)
	}
	// Back to several, then withdrawn: a multipath IPv6 route goes in one delete.
	if w := mustUpdatePaths(t, m, paths(vip, "fd00:100::11", "fd00:100::12")); w != 1 {
		t.Errorf("widening with UpdatePaths: %d writes, want 1", w)
	}
	if got, want := kernelHops(t, n, vip), []string{"fd00:100::11", "fd00:100::12"}; !slices.Equal(got, want) {
		t.Errorf("next hops after widening = %v, want %v", got, want)
	}
	if w := mustUpdatePaths(t, m); w != 1 {
		t.Errorf("withdrawing: %d writes, want 1", w)
	}
	if got := kernelRoutes(t, n, vip); len(got) != 0 {
		t.Errorf("withdrawn IPv6 route still there: %v", got)
	}
	// A dual-stack Service's two VIPs side by side.
	if w := mustReconcilePaths(t, m, paths("192.168.100.200/32", "192.168.100.11", "192.168.100.12"), paths(vip, "fd00:100::11", "fd00:100::12")); w != 2 {
		t.Errorf("both families: %d writes, want 2", w)
	}
	if w := mustReconcilePaths(t, m, paths("192.168.100.200/32", "192.168.100.11", "192.168.100.12"), paths(vip, "fd00:100::11", "fd00:100::12")); w != 0 {
		t.Errorf("both families again: %d writes, want 0", w)
	}
}
