package placement

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
)

// t0 is when the tables' passes run.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// snapNode is one Node of a table's snapshot and its domain, running,
// Ready since an hour and with its facts fresh unless it says otherwise.
type snapNode struct {
	name      string
	ready     v1.ConditionStatus // "" for True
	since     time.Time          // when Ready last changed; zero for an hour ago
	state     libvirtcloud.State // zero for running
	mac       string             // on the bridge; "" for the one testMAC gives it
	noMAC     bool               // no NIC on the bridge
	lastDown  time.Time
	downEvent time.Time
	reported  time.Time // when this process saw its Ready report change
	excluded  bool
	deleting  bool
	gone      bool // the hypervisor says its domain is gone: only the last pass's facts
	deleted   bool // no Node: only the last pass's facts
	stale     bool // its hypervisor cannot be asked: the last pass's facts
	lost      bool // stale, and its guest stopped answering probes
}

// testMAC is a node's MAC: its name's last letter in the last byte.
func testMAC(name string) net.HardwareAddr {
	return net.HardwareAddr{0x52, 0x54, 0, 0, 0, name[len(name)-1]}
}

func (n snapNode) facts() nodeFacts {
	f := nodeFacts{state: libvirtcloud.StateRunning, mac: testMAC(n.name), fresh: !n.stale, lastDown: n.lastDown, downEvent: n.downEvent}
	if n.state != 0 {
		f.state = n.state
	}
	if n.mac != "" {
		f.mac, _ = net.ParseMAC(n.mac)
	}
	if n.noMAC {
		f.mac = nil
	}
	return f
}

func (n snapNode) object() *v1.Node {
	ready := v1.NodeCondition{Type: v1.NodeReady, Status: v1.ConditionTrue, LastTransitionTime: metav1.NewTime(t0.Add(-time.Hour))}
	if n.ready != "" {
		ready.Status = n.ready
	}
	if !n.since.IsZero() {
		ready.LastTransitionTime = metav1.NewTime(n.since)
	}
	obj := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}, Status: v1.NodeStatus{Conditions: []v1.NodeCondition{ready}}}
	if n.excluded {
		obj.Labels = map[string]string{excludeLabel: ""}
	}
	if n.deleting {
		obj.DeletionTimestamp = &metav1.Time{Time: t0}
	}
	return obj
}

// testSnapshot assembles a snapshot as a pass does from what it read:
// the Nodes and their domains' facts, then the last pass's facts of MACs
// no Node's facts have now, judged and ranked. It returns the Nodes judged
// to await a report too.
func testSnapshot(nodes []snapNode, vips map[netip.Addr]vipClaim, unavailable bool) (snapshot, map[string]bool) {
	var s snapshot
	s.reset(len(nodes))
	s.unavailable = unavailable
	reportAt := map[string]time.Time{}
	for _, n := range nodes {
		if !n.reported.IsZero() {
			reportAt[n.name] = n.reported
		}
		if n.deleted {
			continue
		}
		v := nodeView{name: n.name, node: n.object(), facts: n.facts(), known: !n.gone, lost: n.lost}
		if n.gone {
			v.facts = nodeFacts{}
		}
		v.role = roleOf(v.node, v.known)
		s.add(v)
	}
	for _, n := range nodes {
		if !n.deleted && !n.gone {
			continue
		}
		if k, _ := keyOf(n.facts().mac); !indexed(s, k) {
			s.add(nodeView{name: n.name, facts: n.facts()})
		}
	}
	awaiting := map[string]bool{}
	s.judge(reportAt, awaiting)
	s.vips = vips
	s.rank()
	return s, awaiting
}

func indexed(s snapshot, k macKey) bool { _, ok := s.byMAC[k]; return ok }

// TestSnapshotJudgesOnce: which Nodes may answer and which await a report
// follow from the Nodes and their domains alone, the same whatever VIPs
// there are and whoever answers them.
func TestSnapshotJudgesOnce(t *testing.T) {
	for _, tc := range []struct {
		name         string
		nodes        []snapNode
		eligible     []string
		awaiting     []string
		domainUpOnly []string // eligible domains of Nodes that are no candidates
	}{
		{"Ready with a running domain", []snapNode{{name: "a"}, {name: "b"}}, []string{"a", "b"}, nil, nil},
		{"paused counts as running", []snapNode{{name: "a", state: libvirtcloud.StatePaused}}, []string{"a"}, nil, nil},
		{"shut off, crashed, no NIC on the bridge", []snapNode{
			{name: "a", state: libvirtcloud.StateShutOff}, {name: "b", state: libvirtcloud.StateCrashed}, {name: "c", noMAC: true},
		}, nil, nil, nil},
		{"restarted, not reported since: awaits a report", []snapNode{
			{name: "a", lastDown: t0.Add(-10 * time.Second), reported: t0.Add(-20 * time.Second)},
			{name: "b", lastDown: t0.Add(-10 * time.Second)},
		}, nil, []string{"a", "b"}, nil},
		{"restarted, reported since", []snapNode{{name: "a", lastDown: t0.Add(-10 * time.Second), reported: t0.Add(-5 * time.Second)}}, []string{"a"}, nil, nil},
		{"restarted and down again: awaits nothing", []snapNode{{name: "a", lastDown: t0.Add(-10 * time.Second), state: libvirtcloud.StateShutOff}}, nil, nil, nil},
		{"no candidates: NotReady, Unknown, excluded, being deleted", []snapNode{
			{name: "a", ready: v1.ConditionFalse, lastDown: t0.Add(-time.Second)},
			{name: "b", ready: v1.ConditionUnknown},
			{name: "c", excluded: true},
			{name: "d", deleting: true},
		}, nil, nil, []string{"b", "c", "d"}},
		{"a domain gone, a Node deleted", []snapNode{{name: "a", gone: true}, {name: "b", deleted: true}, {name: "c"}}, []string{"c"}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vip := netip.MustParseAddr("10.0.0.1")
			for _, vips := range []map[netip.Addr]vipClaim{nil, {vip: {services: []string{"default/web"}}}} {
				s, awaiting := testSnapshot(tc.nodes, vips, false)
				if !slices.Equal(s.eligible, tc.eligible) {
					t.Errorf("eligible = %q, want %q", s.eligible, tc.eligible)
				}
				if got := slices.Sorted(maps.Keys(awaiting)); !slices.Equal(got, tc.awaiting) {
					t.Errorf("awaiting = %q, want %q", got, tc.awaiting)
				}
				var upOnly []string
				for _, v := range s.views {
					if v.domainEligible && v.role != roleCandidate {
						upOnly = append(upOnly, v.name)
					}
				}
				if !slices.Equal(upOnly, tc.domainUpOnly) {
					t.Errorf("eligible domains of non-candidates = %q, want %q", upOnly, tc.domainUpOnly)
				}
			}
		})
	}
}

// TestSnapshotRanksWhatPoliciesAllow: each VIP ranks the eligible nodes its
// Services allow, as lb.Ranked does; a VIP none may answer is not ranked.
func TestSnapshotRanksWhatPoliciesAllow(t *testing.T) {
	vip1, vip2, vip3 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	nodes := []snapNode{{name: "a"}, {name: "b"}, {name: "c", ready: v1.ConditionFalse}}
	s, _ := testSnapshot(nodes, map[netip.Addr]vipClaim{
		vip1: {services: []string{"default/any"}},
		vip2: {services: []string{"default/local"}, onlyOn: map[string]bool{"b": true, "c": true}},
		vip3: {services: []string{"default/nowhere"}, onlyOn: map[string]bool{}},
	}, false)
	want := map[netip.Addr][]string{
		vip1: lb.Ranked(vip1, []string{"a", "b"}, maxSpreadPaths),
		vip2: {"b"},
	}
	if fmt.Sprint(s.ranked) != fmt.Sprint(want) {
		t.Errorf("ranked = %v, want %v", s.ranked, want)
	}
}

// TestSnapshotRanksDualStackTogether: a VIP that ranks as another ranks
// the nodes both allow, so both have one first node.
func TestSnapshotRanksDualStackTogether(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")
	nodes := []snapNode{{name: "a"}, {name: "b"}, {name: "c"}, {name: "d"}}
	for _, onlyOn := range []map[string]bool{nil, {"b": true, "d": true}} {
		s, _ := testSnapshot(nodes, map[netip.Addr]vipClaim{
			v4: {services: []string{"default/dual"}, onlyOn: onlyOn},
			v6: {services: []string{"default/dual"}, rankAs: v4},
		}, false)
		if len(s.ranked[v4]) == 0 || !slices.Equal(s.ranked[v4], s.ranked[v6]) {
			t.Errorf("onlyOn %v: %s ranks %v, %s ranks %v; want the same", onlyOn, v4, s.ranked[v4], v6, s.ranked[v6])
		}
		if onlyOn != nil && !onlyOn[s.ranked[v6][0]] {
			t.Errorf("onlyOn %v: %s answered by %s", onlyOn, v6, s.ranked[v6][0])
		}
	}
}
