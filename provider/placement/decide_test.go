package placement

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/metrics"
)

// showChange is a change as one line, every field in it.
func showChange(c change) string {
	at := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.Sub(t0).String()
	}
	return fmt.Sprintf("%s %s %v node=%q mac=%s from=%q reason=%q cause=%s until=%s",
		c.kind, c.vip, c.services, c.node, c.mac, c.from, c.reason, at(c.cause), at(c.until))
}

// expected builds the changes a table expects for vip, held by services:
// a set onto node to, and a keep on node.
func expected(vip netip.Addr, services []string) (set func(to, from, reason string, cause time.Time) change, kept func(node, reason string, until time.Time) change) {
	set = func(to, from, reason string, cause time.Time) change {
		return change{kind: setVIP, vip: vip, services: services, node: to, mac: testMAC(to), from: from, reason: reason, cause: cause}
	}
	kept = func(node, reason string, until time.Time) change {
		return change{kind: keepVIP, vip: vip, services: services, node: node, mac: testMAC(node), reason: reason, until: until}
	}
	return set, kept
}

// TestDecide: what a pass does to each VIP, from a snapshot and the MAC
// answering each VIP now, with no announcer.
func TestDecide(t *testing.T) {
	vip1, vip2 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	web := []string{"default/web"}
	claims := func(onlyOn map[string]bool) map[netip.Addr]vipClaim {
		return map[netip.Addr]vipClaim{vip1: {services: web, onlyOn: onlyOn}}
	}
	// Of nodes a and b, vip1 ranks win first and lose second.
	r := lb.Ranked(vip1, []string{"a", "b"}, 2)
	win, lose := r[0], r[1]
	mac := testMAC
	stranger, _ := net.ParseMAC("52:54:00:00:00:ff")
	set, kept := expected(vip1, web)
	downAt := t0.Add(-2 * time.Second)
	for _, tc := range []struct {
		name        string
		nodes       []snapNode
		unavailable bool
		vips        map[netip.Addr]vipClaim
		answering   map[netip.Addr]net.HardwareAddr
		want        []change
	}{
		{"a new VIP: its first-ranked node announces it",
			[]snapNode{{name: "a"}, {name: "b"}}, false, claims(nil), nil,
			[]change{set(win, "", "", time.Time{})}},
		{"answered by its first-ranked node: kept",
			[]snapNode{{name: "a"}, {name: "b"}}, false, claims(nil), map[netip.Addr]net.HardwareAddr{vip1: mac(win)},
			[]change{kept(win, keptPlaced, time.Time{})}},
		{"released VIPs go first, in VIP order",
			[]snapNode{{name: "a"}}, false, map[netip.Addr]vipClaim{vip1: {services: web}},
			map[netip.Addr]net.HardwareAddr{vip2: mac("a"), netip.MustParseAddr("10.0.0.9"): mac("a"), netip.MustParseAddr("10.0.0.0"): mac("a")},
			[]change{
				{kind: removeVIP, vip: netip.MustParseAddr("10.0.0.0"), reason: removedReleased},
				{kind: removeVIP, vip: vip2, reason: removedReleased},
				{kind: removeVIP, vip: netip.MustParseAddr("10.0.0.9"), reason: removedReleased},
				set("a", "", "", time.Time{}),
			}},
		{"no eligible node, unanswered: a warning",
			[]snapNode{{name: "a", ready: v1.ConditionFalse}}, false, claims(nil), nil,
			[]change{{kind: warnVIP, vip: vip1, services: web, reason: noEligibleNode}}},
		{"no eligible node any more: withdrawn",
			[]snapNode{{name: "a", state: libvirtcloud.StateShutOff}}, false, claims(nil), map[netip.Addr]net.HardwareAddr{vip1: mac("a")},
			[]change{{kind: removeVIP, vip: vip1, services: web, reason: noEligibleNode}}},
		{"domain down: moved, from its libvirt event",
			[]snapNode{{name: "a", state: libvirtcloud.StateShutOff, lastDown: downAt, downEvent: downAt}, {name: "b"}}, false, claims(nil),
			map[netip.Addr]net.HardwareAddr{vip1: mac("a")},
			[]change{set("b", "a", metrics.MoveDomainDown, downAt)}},
		{"domain restarted, no report since: moved",
			[]snapNode{{name: "a", lastDown: downAt, reported: downAt.Add(-time.Second)}, {name: "b"}}, false, claims(nil),
			map[netip.Addr]net.HardwareAddr{vip1: mac("a")},
			[]change{set("b", "a", metrics.MoveDomainDown, time.Time{})}},
		{"domain restarted, reported since: eligible again",
			[]snapNode{{name: "a", lastDown: downAt, reported: downAt.Add(time.Second)}}, false, claims(nil), nil,
			[]change{set("a", "", "", time.Time{})}},
		{"paused domain: kept",
			[]snapNode{{name: "a", state: libvirtcloud.StatePaused}}, false, claims(nil), map[netip.Addr]net.HardwareAddr{vip1: mac("a")},
			[]change{kept("a", keptPlaced, time.Time{})}},
		{"domain gone: moved, from the last pass's event",
			[]snapNode{{name: "a", gone: true, downEvent: downAt}, {name: "b"}}, false, claims(nil),
			map[netip.Addr]net.HardwareAddr{vip1: mac("a")},
			[]change{set("b", "a", metrics.MoveDomainDown, downAt)}},
		{"Node deleted",
			[]snapNode{{name: "a", deleted: true}, {name: "b"}}, false, claims(nil), map[netip.Addr]net.HardwareAddr{vip1: mac("a")},
			[]change{set("b", "a", metrics.MoveNodeDeleted, time.Time{})}},
		{"Node being deleted",
			[]snapNode{{name: "a", deleting: true}, {name: "b"}}, false, claims(nil), map[netip.Addr]net.HardwareAddr{vip1: mac("a")},
			[]change{set("b", "a", metrics.MoveNodeDeleted, time.Time{})}},
		{"Node excluded",
			[]snapNode{{name: "a", excluded: true}, {name: "b"}}, false, claims(nil), map[netip.Addr]net.HardwareAddr{vip1: mac("a")},
			[]change{set("b", "a", metrics.MoveNodeExcluded, time.Time{})}},
		{"Node NotReady",
			[]snapNode{{name: "a", ready: v1.ConditionFalse}, {name: "b"}}, false, claims(nil), map[netip.Addr]net.HardwareAddr{vip1: mac("a")},
			[]change{set("b", "a", metrics.MoveNodeNotReady, time.Time{})}},
		{"Local policy: no ready endpoint on the node any more",
			[]snapNode{{name: "a"}, {name: "b"}}, false, claims(map[string]bool{"b": true}), map[netip.Addr]net.HardwareAddr{vip1: mac("a")},
			[]change{set("b", "a", metrics.MoveEndpoints, time.Time{})}},
		{"another node wins it",
			[]snapNode{{name: "a"}, {name: "b"}}, false, claims(nil), map[netip.Addr]net.HardwareAddr{vip1: mac(lose)},
			[]change{set(win, lose, metrics.MoveRebalance, time.Time{})}},
		{"answered by a MAC no Node has",
			[]snapNode{{name: "a"}}, false, claims(nil), map[netip.Addr]net.HardwareAddr{vip1: stranger},
			[]change{set("a", stranger.String(), metrics.MoveUnknown, time.Time{})}},
		{"hypervisor unavailable: a node known only from the last pass keeps it",
			[]snapNode{{name: win}, {name: lose, stale: true}}, true, claims(nil), map[netip.Addr]net.HardwareAddr{vip1: mac(lose)},
			[]change{kept(lose, keptUnavailable, time.Time{})}},
		{"hypervisor unavailable, its guest lost: moved",
			[]snapNode{{name: win}, {name: lose, stale: true, lost: true}}, true, claims(nil), map[netip.Addr]net.HardwareAddr{vip1: mac(lose)},
			[]change{set(win, lose, metrics.MoveHostLost, time.Time{})}},
		{"hypervisor unavailable, its guest lost, no other node: withdrawn",
			[]snapNode{{name: "a", stale: true, lost: true}}, true, claims(nil), map[netip.Addr]net.HardwareAddr{vip1: mac("a")},
			[]change{{kind: removeVIP, vip: vip1, services: web, reason: noEligibleNode}}},
		{"hypervisor unavailable, a lost guest is not placed on",
			[]snapNode{{name: win, stale: true, lost: true}, {name: lose}}, true, claims(nil), nil,
			[]change{set(lose, "", "", time.Time{})}},
		{"hypervisor unavailable: a MAC no Node has keeps it",
			[]snapNode{{name: "a"}}, true, claims(nil), map[netip.Addr]net.HardwareAddr{vip1: stranger},
			[]change{{kind: keepVIP, vip: vip1, services: web, mac: stranger, reason: keptUnavailable}}},
		{"hypervisor unavailable: a node known now is placed as ever",
			[]snapNode{{name: win, stale: true}, {name: lose}}, true, claims(nil), map[netip.Addr]net.HardwareAddr{vip1: mac(lose)},
			[]change{set(win, lose, metrics.MoveRebalance, time.Time{})}},
		{"Unknown within the hold: kept, until the hold ends",
			[]snapNode{{name: "a", ready: v1.ConditionUnknown, since: t0.Add(-10 * time.Second)}, {name: "b"}}, false, claims(nil),
			map[netip.Addr]net.HardwareAddr{vip1: mac("a")},
			[]change{kept("a", keptUnknown, t0.Add(UnknownHold-10*time.Second))}},
		{"Unknown past the hold: moved",
			[]snapNode{{name: "a", ready: v1.ConditionUnknown, since: t0.Add(-UnknownHold)}, {name: "b"}}, false, claims(nil),
			map[netip.Addr]net.HardwareAddr{vip1: mac("a")},
			[]change{set("b", "a", metrics.MoveNodeNotReady, time.Time{})}},
		{"Unknown with no other node: kept with nothing to wait for",
			[]snapNode{{name: "a", ready: v1.ConditionUnknown, since: t0.Add(-time.Hour)}}, false, claims(nil),
			map[netip.Addr]net.HardwareAddr{vip1: mac("a")},
			[]change{kept("a", keptUnknown, time.Time{})}},
		{"Unknown, its Local Service's endpoints elsewhere: moved",
			[]snapNode{{name: "a", ready: v1.ConditionUnknown, since: t0.Add(-time.Second)}, {name: "b"}}, false, claims(map[string]bool{"b": true}),
			map[netip.Addr]net.HardwareAddr{vip1: mac("a")},
			[]change{set("b", "a", metrics.MoveNodeNotReady, time.Time{})}},
		{"Unknown, its domain restarted and not reported since: moved",
			[]snapNode{{name: "a", ready: v1.ConditionUnknown, since: t0.Add(-time.Second), lastDown: downAt}, {name: "b"}}, false, claims(nil),
			map[netip.Addr]net.HardwareAddr{vip1: mac("a")},
			[]change{set("b", "a", metrics.MoveDomainDown, time.Time{})}},
		{"Unknown, its hypervisor unavailable: kept as unknown now",
			[]snapNode{{name: "a", ready: v1.ConditionUnknown, since: t0.Add(-time.Hour), stale: true}, {name: "b"}}, true, claims(nil),
			map[netip.Addr]net.HardwareAddr{vip1: mac("a")},
			[]change{kept("a", keptUnavailable, time.Time{})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, _ := testSnapshot(tc.nodes, tc.vips, tc.unavailable)
			checkDecide(t, decide(snap, tc.answering, nil, t0), tc.want)
		})
	}
}

// checkDecide compares what decide said with want, one line per change.
func checkDecide(t *testing.T, changes, want []change) {
	t.Helper()
	var got, wanted []string
	for _, c := range changes {
		got = append(got, showChange(c))
	}
	for _, c := range want {
		wanted = append(wanted, showChange(c))
	}
	if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", wanted) {
		t.Errorf("decide:\n got %q\nwant %q", got, wanted)
	}
}

// TestDecideDamping: a VIP with a Local-policy Service stays on its live
// node until its damping ends, whatever endpoints and ranking say; a node
// that is gone gives it up at once, and a VIP of Cluster-policy Services
// or a first announcement is never damped.
func TestDecideDamping(t *testing.T) {
	vip1 := netip.MustParseAddr("10.0.0.1")
	web := []string{"default/web"}
	onlyOn := func(nodes ...string) map[string]bool {
		m := map[string]bool{}
		for _, n := range nodes {
			m[n] = true
		}
		return m
	}
	r := lb.Ranked(vip1, []string{"a", "b"}, 2)
	win, lose := r[0], r[1]
	mac := testMAC
	set, kept := expected(vip1, web)
	ends := t0.Add(3 * time.Second)
	downAt := t0.Add(-time.Second)
	two := []snapNode{{name: "a"}, {name: "b"}}
	onA := map[netip.Addr]net.HardwareAddr{vip1: mac("a")}
	for _, tc := range []struct {
		name      string
		nodes     []snapNode
		onlyOn    map[string]bool // nil: Cluster policy
		answering map[netip.Addr]net.HardwareAddr
		damped    time.Time // when vip1's damping ends
		want      change
	}{
		{name: "endpoints left its node within the damping: kept until it ends",
			nodes: two, onlyOn: onlyOn("b"), answering: onA, damped: ends, want: kept("a", keptDamped, ends)},
		{name: "endpoints left its node, the damping over: moved",
			nodes: two, onlyOn: onlyOn("b"), answering: onA, damped: t0, want: set("b", "a", metrics.MoveEndpoints, time.Time{})},
		{name: "no endpoint anywhere within the damping: kept until it ends",
			nodes: two, onlyOn: onlyOn(), answering: onA, damped: ends, want: kept("a", keptDamped, ends)},
		{name: "no endpoint anywhere, the damping over: withdrawn",
			nodes: two, onlyOn: onlyOn(), answering: onA, damped: downAt,
			want: change{kind: removeVIP, vip: vip1, services: web, reason: noEligibleNode}},
		{name: "another node with endpoints wins within the damping: kept",
			nodes: two, onlyOn: onlyOn("a", "b"), answering: map[netip.Addr]net.HardwareAddr{vip1: mac(lose)}, damped: ends,
			want: kept(lose, keptDamped, ends)},
		{name: "its node still wins: placed, nothing to wait for",
			nodes: two, onlyOn: onlyOn("a", "b"), answering: map[netip.Addr]net.HardwareAddr{vip1: mac(win)}, damped: ends,
			want: kept(win, keptPlaced, time.Time{})},
		{name: "its domain down within the damping: moved at once",
			nodes:  []snapNode{{name: "a", state: libvirtcloud.StateShutOff, lastDown: downAt, downEvent: downAt}, {name: "b"}},
			onlyOn: onlyOn("b"), answering: onA, damped: ends, want: set("b", "a", metrics.MoveDomainDown, downAt)},
		{name: "its domain restarted, not reported since: moved at once",
			nodes:  []snapNode{{name: "a", lastDown: downAt}, {name: "b"}},
			onlyOn: onlyOn("a", "b"), answering: onA, damped: ends, want: set("b", "a", metrics.MoveDomainDown, time.Time{})},
		{name: "its domain gone within the damping: moved at once",
			nodes:  []snapNode{{name: "a", gone: true}, {name: "b"}},
			onlyOn: onlyOn("b"), answering: onA, damped: ends, want: set("b", "a", metrics.MoveDomainDown, time.Time{})},
		{name: "its Node deleted within the damping: moved at once",
			nodes:  []snapNode{{name: "a", deleted: true}, {name: "b"}},
			onlyOn: onlyOn("b"), answering: onA, damped: ends, want: set("b", "a", metrics.MoveNodeDeleted, time.Time{})},
		{name: "its Node NotReady within the damping: moved at once",
			nodes:  []snapNode{{name: "a", ready: v1.ConditionFalse}, {name: "b"}},
			onlyOn: onlyOn("a", "b"), answering: onA, damped: ends, want: set("b", "a", metrics.MoveNodeNotReady, time.Time{})},
		{name: "its Node excluded within the damping: moved at once",
			nodes:  []snapNode{{name: "a", excluded: true}, {name: "b"}},
			onlyOn: onlyOn("a", "b"), answering: onA, damped: ends, want: set("b", "a", metrics.MoveNodeExcluded, time.Time{})},
		{name: "its domain off the bridge within the damping: moved at once",
			nodes:  []snapNode{{name: "a", noMAC: true}, {name: "b"}},
			onlyOn: onlyOn("a", "b"), answering: onA, damped: ends, want: set("b", mac("a").String(), metrics.MoveUnknown, time.Time{})},
		{name: "Cluster policy within the damping: moved at once",
			nodes: two, answering: map[netip.Addr]net.HardwareAddr{vip1: mac(lose)}, damped: ends,
			want: set(win, lose, metrics.MoveRebalance, time.Time{})},
		{name: "first announcement within the damping: announced",
			nodes: two, onlyOn: onlyOn("b"), damped: ends, want: set("b", "", "", time.Time{})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, _ := testSnapshot(tc.nodes, map[netip.Addr]vipClaim{vip1: {services: web, onlyOn: tc.onlyOn}}, false)
			checkDecide(t, decide(snap, tc.answering, map[netip.Addr]time.Time{vip1: tc.damped}, t0), []change{tc.want})
		})
	}
}
