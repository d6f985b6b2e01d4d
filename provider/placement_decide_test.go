package provider

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
	set := func(to, from, reason string, cause time.Time) change {
		return change{kind: setVIP, vip: vip1, services: web, node: to, mac: mac(to), from: from, reason: reason, cause: cause}
	}
	kept := func(node, reason string, until time.Time) change {
		return change{kind: keepVIP, vip: vip1, services: web, node: node, mac: mac(node), reason: reason, until: until}
	}
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
			var got, want []string
			for _, c := range decide(snap, tc.answering, t0) {
				got = append(got, showChange(c))
			}
			for _, c := range tc.want {
				want = append(want, showChange(c))
			}
			if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", want) {
				t.Errorf("decide:\n got %q\nwant %q", got, want)
			}
		})
	}
}
