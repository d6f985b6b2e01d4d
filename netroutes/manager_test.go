package netroutes

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Privileged tests: each runs in its own network namespace (see ns_test.go).

func newLab(t *testing.T, cfg Config) (*testNS, *Manager) {
	t.Helper()
	n := newTestNS(t)
	n.addBridge(t, 3, labV4, labV6)
	if cfg.Bridge == "" {
		cfg.Bridge = labBridge
	}
	m, err := New(n.handle(t), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return n, m
}

// labNodes are three dual-stack nodes on the lab bridge.
func labNodes() []Node {
	return []Node{
		node("n1", []string{"10.244.1.0/24", "fd10:244:1::/64"}, "192.168.100.11", "fd00:100::11"),
		node("n2", []string{"10.244.2.0/24", "fd10:244:2::/64"}, "192.168.100.12", "fd00:100::12"),
		node("n3", []string{"10.244.3.0/24"}, "192.168.100.13"),
	}
}

func desiredFor(t *testing.T, m *Manager, nodes []Node) []Route {
	t.Helper()
	subnets, err := m.Subnets()
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{pfx("192.168.100.0/24"), pfx("fd00:100::/64")}
	if !slices.Equal(subnets, want) {
		t.Fatalf("Subnets = %v, want %v", subnets, want)
	}
	routes, problems := Desired(subnets, nodes)
	if len(problems) > 0 {
		t.Fatalf("Desired problems: %v", problems)
	}
	return routes
}

func mustReconcile(t *testing.T, m *Manager, desired []Route) Result {
	t.Helper()
	res, err := m.Reconcile(desired)
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	return res
}

func mustList(t *testing.T, m *Manager) []Route {
	t.Helper()
	got, err := m.List()
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return got
}

// kernelRoutes dumps every route to dst in the main table, whoever owns it.
func kernelRoutes(t *testing.T, n *testNS, dst string) []netlink.Route {
	t.Helper()
	_, ipn, err := net.ParseCIDR(dst)
	if err != nil {
		t.Fatal(err)
	}
	got, err := n.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Dst: ipn}, netlink.RT_FILTER_DST)
	if err != nil {
		t.Fatalf("dump routes to %s: %v", dst, err)
	}
	return got
}

// addForeign installs a route someone else owns, as an operator would.
func addForeign(t *testing.T, n *testNS, dst, gw string, proto netlink.RouteProtocol, metric int) {
	t.Helper()
	_, ipn, err := net.ParseCIDR(dst)
	if err != nil {
		t.Fatal(err)
	}
	link, err := n.h.LinkByName(labBridge)
	if err != nil {
		t.Fatal(err)
	}
	r := &netlink.Route{Dst: ipn, Gw: net.ParseIP(gw), LinkIndex: link.Attrs().Index, Protocol: proto, Priority: metric}
	if err := n.h.RouteAdd(r); err != nil {
		t.Fatalf("add foreign route %s via %s: %v", dst, gw, err)
	}
}

func TestReconcileInstallsOwnedRoutes(t *testing.T) {
	n, m := newLab(t, Config{})
	desired := desiredFor(t, m, labNodes())
	if len(desired) != 5 {
		t.Fatalf("desired = %v, want 5 routes", desired)
	}

	res := mustReconcile(t, m, desired)
	if !slices.Equal(res.Added, desired) || len(res.Removed) != 0 {
		t.Errorf("Result = %+v, want all %d added", res, len(desired))
	}
	if got := mustList(t, m); !slices.Equal(got, desired) {
		t.Errorf("List = %v, want %v", got, desired)
	}
	if w := m.Writes(); w != uint64(len(desired)) {
		t.Errorf("writes = %d, want %d", w, len(desired))
	}
	// The route as DESIGN.md spells it, read back by iproute2.
	for _, want := range []string{
		"10.244.1.0/24 via 192.168.100.11 dev labbr0 proto 76 metric 3076",
		"fd10:244:1::/64 via fd00:100::11 dev labbr0 proto 76 metric 3076",
	} {
		if out := n.show(t); !strings.Contains(out, want) {
			t.Errorf("ip route show lacks %q:\n%s", want, out)
		}
	}

	before := m.Writes()
	res = mustReconcile(t, m, desired)
	if w := m.Writes() - before; w != 0 || len(res.Added)+len(res.Removed) != 0 {
		t.Errorf("second pass: %d writes, result %+v; want none", w, res)
	}
}

func TestForeignRouteToSameDestinationCoexists(t *testing.T) {
	n, m := newLab(t, Config{})
	// An operator's static route to n1's pod CIDR (metric 0) and a foreign
	// route to a prefix labcloud never heard of.
	addForeign(t, n, "10.244.1.0/24", "192.168.100.50", unix.RTPROT_STATIC, 0)
	addForeign(t, n, "10.99.0.0/16", "192.168.100.51", unix.RTPROT_BOOT, 0)
	foreign := kernelRoutes(t, n, "10.244.1.0/24")

	desired := desiredFor(t, m, labNodes())
	mustReconcile(t, m, desired)

	got := kernelRoutes(t, n, "10.244.1.0/24")
	if len(got) != 2 {
		t.Fatalf("routes to 10.244.1.0/24 = %v, want the foreign one and ours", got)
	}
	if !hasRoute(got, foreign[0]) {
		t.Errorf("foreign route changed: had %v, now %v", foreign[0], got)
	}
	if slices.ContainsFunc(mustList(t, m), func(r Route) bool { return r.Gateway == addr("192.168.100.50") }) {
		t.Error("List shows the foreign route")
	}
	// The lower metric wins the lookup: the operator's route stays in charge.
	via, err := n.h.RouteGet(net.ParseIP("10.244.1.5"))
	if err != nil || len(via) == 0 || !via[0].Gw.Equal(net.ParseIP("192.168.100.50")) {
		t.Errorf("lookup of 10.244.1.5 = %v, %v; want via the foreign 192.168.100.50", via, err)
	}

	// Dropping every node removes ours and nothing else.
	before := m.Writes()
	res := mustReconcile(t, m, nil)
	if len(res.Removed) != len(desired) || m.Writes()-before != uint64(len(desired)) {
		t.Errorf("Reconcile(nil) = %+v with %d writes, want %d removals", res, m.Writes()-before, len(desired))
	}
	if got := kernelRoutes(t, n, "10.244.1.0/24"); len(got) != 1 || !hasRoute(got, foreign[0]) {
		t.Errorf("after removing ours, routes to 10.244.1.0/24 = %v, want only the foreign one", got)
	}
	if got := kernelRoutes(t, n, "10.99.0.0/16"); len(got) != 1 {
		t.Errorf("unrelated foreign route gone: %v", got)
	}
}

func TestForeignRouteWithOurMetricIsNotReplaced(t *testing.T) {
	n, m := newLab(t, Config{})
	addForeign(t, n, "10.244.1.0/24", "192.168.100.50", unix.RTPROT_STATIC, DefaultMetric)

	desired := desiredFor(t, m, labNodes())
	res, err := m.Reconcile(desired)
	if err == nil || !errors.Is(err, unix.EEXIST) || !strings.Contains(err.Error(), "10.244.1.0/24 via 192.168.100.11") {
		t.Fatalf("Reconcile error = %v, want EEXIST naming the route", err)
	}
	if len(res.Added) != len(desired)-1 {
		t.Errorf("added %v, want every other route despite the clash", res.Added)
	}
	got := kernelRoutes(t, n, "10.244.1.0/24")
	if len(got) != 1 || got[0].Protocol != unix.RTPROT_STATIC || !got[0].Gw.Equal(net.ParseIP("192.168.100.50")) {
		t.Errorf("routes to 10.244.1.0/24 = %v, want the foreign one untouched", got)
	}
}

func TestStaleOwnedRoutesAreRemoved(t *testing.T) {
	n, m := newLab(t, Config{})
	// Left behind by an earlier run: a node that is gone, and an owned route
	// in another shape (metric) for a node that still exists.
	for _, args := range [][]string{
		{"route", "add", "10.244.9.0/24", "via", "192.168.100.19", "dev", labBridge, "proto", "76", "metric", "3076"},
		{"route", "add", "10.244.2.0/24", "via", "192.168.100.12", "dev", labBridge, "proto", "76", "metric", "50"},
	} {
		if err := n.ip(t, args...); err != nil {
			t.Fatal(err)
		}
	}
	if got := mustList(t, m); !slices.Equal(got, []Route{rt("10.244.9.0/24", "192.168.100.19")}) {
		t.Errorf("List = %v, want only the well-formed stale route", got)
	}

	desired := desiredFor(t, m, labNodes())
	res := mustReconcile(t, m, desired)
	if !slices.Contains(res.Removed, rt("10.244.9.0/24", "192.168.100.19")) {
		t.Errorf("Result.Removed = %v, want the gone node's route", res.Removed)
	}
	if got := kernelRoutes(t, n, "10.244.9.0/24"); len(got) != 0 {
		t.Errorf("stale route still there: %v", got)
	}
	if got := kernelRoutes(t, n, "10.244.2.0/24"); len(got) != 1 || got[0].Priority != DefaultMetric {
		t.Errorf("routes to 10.244.2.0/24 = %v, want only ours at metric %d", got, DefaultMetric)
	}
	if got := mustList(t, m); !slices.Equal(got, desired) {
		t.Errorf("List = %v, want %v", got, desired)
	}
}

func TestGatewayChangeIsOneReplace(t *testing.T) {
	n, m := newLab(t, Config{})
	old := []Route{rt("10.244.1.0/24", "192.168.100.11"), rt("fd10:244:1::/64", "fd00:100::11")}
	moved := []Route{rt("10.244.1.0/24", "192.168.100.21"), rt("fd10:244:1::/64", "fd00:100::21")}
	mustReconcile(t, m, old)

	before := m.Writes()
	res := mustReconcile(t, m, moved)
	if w := m.Writes() - before; w != 2 {
		t.Errorf("two gateway changes took %d writes, want 2 replaces", w)
	}
	if !slices.Equal(res.Added, moved) || !slices.Equal(res.Removed, old) {
		t.Errorf("Result = %+v, want added %v removed %v", res, moved, old)
	}
	for _, r := range moved {
		got := kernelRoutes(t, n, r.Dst.String())
		if len(got) != 1 || !got[0].Gw.Equal(r.Gateway.AsSlice()) {
			t.Errorf("routes to %s = %v, want one via %s", r.Dst, got, r.Gateway)
		}
	}
}

func TestReconcileRebuildsAfterFlush(t *testing.T) {
	n, m := newLab(t, Config{})
	desired := desiredFor(t, m, labNodes())
	mustReconcile(t, m, desired)

	for _, fam := range []string{"-4", "-6"} {
		if err := n.ip(t, fam, "route", "flush", "proto", "76"); err != nil {
			t.Fatal(err)
		}
	}
	if got := mustList(t, m); len(got) != 0 {
		t.Fatalf("List after flush = %v, want empty", got)
	}
	if res := mustReconcile(t, m, desired); !slices.Equal(res.Added, desired) {
		t.Errorf("after flush Added = %v, want %v", res.Added, desired)
	}
	if got := mustList(t, m); !slices.Equal(got, desired) {
		t.Errorf("List after rebuild = %v, want %v", got, desired)
	}

	// A restarted libvirt network: the bridge comes back with a new index and
	// without routes.
	br, err := n.h.LinkByName(labBridge)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.h.LinkDel(br); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Reconcile(desired); err == nil || !strings.Contains(err.Error(), labBridge) {
		t.Errorf("Reconcile without bridge: err = %v, want one naming %s", err, labBridge)
	}
	n.addBridge(t, 0, labV4, labV6)
	mustReconcile(t, m, desired)
	if got := mustList(t, m); !slices.Equal(got, desired) {
		t.Errorf("List after bridge restart = %v, want %v", got, desired)
	}
	before := m.Writes()
	mustReconcile(t, m, desired)
	if w := m.Writes() - before; w != 0 {
		t.Errorf("second pass after rebuild made %d writes, want 0", w)
	}
}

func TestEnsureAndRemoveAreIdempotent(t *testing.T) {
	n, m := newLab(t, Config{})
	r := rt("10.244.1.0/24", "192.168.100.11")
	r6 := rt("fd10:244:1::/64", "fd00:100::11")

	steps := []struct {
		name   string
		do     func() error
		writes uint64
	}{
		{"ensure v4", func() error { return m.Ensure(r) }, 1},
		{"ensure v4 again", func() error { return m.Ensure(r) }, 0},
		{"ensure v6", func() error { return m.Ensure(r6) }, 1},
		{"ensure v6 again", func() error { return m.Ensure(r6) }, 0},
		{"ensure new gateway", func() error { return m.Ensure(rt("10.244.1.0/24", "192.168.100.21")) }, 1},
		{"remove old gateway (gone)", func() error { return m.Remove(r) }, 0},
		{"remove new gateway", func() error { return m.Remove(rt("10.244.1.0/24", "192.168.100.21")) }, 1},
		{"remove again", func() error { return m.Remove(rt("10.244.1.0/24", "192.168.100.21")) }, 0},
		{"remove v6 by destination", func() error { return m.Remove(Route{Dst: r6.Dst}) }, 1},
	}
	for _, s := range steps {
		before := m.Writes()
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if w := m.Writes() - before; w != s.writes {
			t.Errorf("%s: %d writes, want %d", s.name, w, s.writes)
		}
	}
	if got := mustList(t, m); len(got) != 0 {
		t.Errorf("List = %v, want empty", got)
	}

	// Remove never reaches a foreign route, even one that looks identical.
	addForeign(t, n, "10.244.5.0/24", "192.168.100.15", unix.RTPROT_STATIC, DefaultMetric)
	if err := m.Remove(rt("10.244.5.0/24", "192.168.100.15")); err != nil {
		t.Fatalf("Remove of a foreign look-alike: %v", err)
	}
	if got := kernelRoutes(t, n, "10.244.5.0/24"); len(got) != 1 {
		t.Errorf("foreign route removed: %v", got)
	}

	if err := m.Ensure(rt("10.244.1.7/24", "192.168.100.11")); err == nil || !strings.Contains(err.Error(), "host bits") {
		t.Errorf("Ensure with host bits: err = %v, want a validation error", err)
	}
	if err := m.Remove(Route{}); err == nil {
		t.Error("Remove of a zero Route succeeded, want an error")
	}
}

func TestTableAndProtocolIsolateOwners(t *testing.T) {
	n, def := newLab(t, Config{})
	other, err := New(n.handle(t), Config{Bridge: labBridge, Protocol: 201, Table: 100, Metric: 10})
	if err != nil {
		t.Fatal(err)
	}
	mine := []Route{rt("10.244.1.0/24", "192.168.100.11")}
	theirs := []Route{rt("10.244.1.0/24", "192.168.100.12"), rt("fd10:244:2::/64", "fd00:100::12")}
	mustReconcile(t, def, mine)
	mustReconcile(t, other, theirs)

	if got := mustList(t, def); !slices.Equal(got, mine) {
		t.Errorf("default manager lists %v, want %v", got, mine)
	}
	if got := mustList(t, other); !slices.Equal(got, theirs) {
		t.Errorf("table 100 manager lists %v, want %v", got, theirs)
	}
	if out := n.show(t, "table", "100"); !strings.Contains(out, "10.244.1.0/24 via 192.168.100.12 dev labbr0 proto 201 metric 10") {
		t.Errorf("table 100:\n%s", out)
	}
	mustReconcile(t, other, nil)
	if got := mustList(t, def); !slices.Equal(got, mine) {
		t.Errorf("clearing table 100 touched main: %v", got)
	}
}

func TestNewNamesMissingBridge(t *testing.T) {
	n := newTestNS(t)
	_, err := New(n.handle(t), Config{Bridge: "virbr-missing"})
	if err == nil || !strings.Contains(err.Error(), `"virbr-missing"`) {
		t.Errorf("New = %v, want an error naming the bridge", err)
	}
	var notFound netlink.LinkNotFoundError
	if !errors.As(err, &notFound) {
		t.Errorf("New error %v does not wrap netlink.LinkNotFoundError", err)
	}
	if _, err := New(n.handle(t), Config{}); err == nil || !strings.Contains(err.Error(), "Config.Bridge") {
		t.Errorf("New with no bridge = %v, want an error naming Config.Bridge", err)
	}
}

func TestRetryDump(t *testing.T) {
	calls := 0
	err := retryDump(func() error {
		if calls++; calls < 3 {
			return netlink.ErrDumpInterrupted
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Errorf("retryDump = %v after %d calls, want success on the 3rd", err, calls)
	}

	calls = 0
	err = retryDump(func() error { calls++; return netlink.ErrDumpInterrupted })
	if !errors.Is(err, netlink.ErrDumpInterrupted) || calls != dumpAttempts {
		t.Errorf("retryDump = %v after %d calls, want ErrDumpInterrupted after %d", err, calls, dumpAttempts)
	}

	calls = 0
	boom := errors.New("boom")
	if err := retryDump(func() error { calls++; return boom }); err != boom || calls != 1 {
		t.Errorf("retryDump = %v after %d calls, want boom at once", err, calls)
	}
}

// hasRoute reports whether routes holds want with the same owner, gateway,
// device and metric.
func hasRoute(routes []netlink.Route, want netlink.Route) bool {
	return slices.ContainsFunc(routes, func(r netlink.Route) bool {
		return r.Protocol == want.Protocol && r.Gw.Equal(want.Gw) &&
			r.LinkIndex == want.LinkIndex && r.Priority == want.Priority
	})
}
