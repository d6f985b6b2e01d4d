package provider

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/provider/internal/lbtest"
	"github.com/labcloud/labcloud/provider/placement"
)

func nodeNamesOf(nodes []lbtest.Node) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.Name)
	}
	return out
}

func macOfNode(name string) string {
	for _, n := range testNodes {
		if n.Name == name {
			return n.MAC.String()
		}
	}
	return ""
}

// touchNodes makes a Node change the placement reads (its addresses), as
// any Node or EndpointSlice event during an outage would.
func (f *lbFixture) touchNodes(value string) {
	f.t.Helper()
	for _, n := range testNodes {
		obj, err := f.client.CoreV1().Nodes().Get(f.ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			f.t.Fatal(err)
		}
		obj.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeHostName, Address: n.Name + "-" + value}}
		if _, err := f.client.CoreV1().Nodes().UpdateStatus(f.ctx, obj, metav1.UpdateOptions{}); err != nil {
			f.t.Fatal(err)
		}
	}
}

// TestPlacementIsRendezvous: every VIP is answered by the first of lb.Ranked
// among the eligible nodes, and a restarted CCM (loading the statuses)
// places every VIP exactly the same.
func TestPlacementIsRendezvous(t *testing.T) {
	f := newLBFixture(t, "10.0.0.0/27").start()
	all := nodeNamesOf(testNodes)
	placed := map[netip.Addr]string{}
	var svcs []*v1.Service
	for i := range 12 {
		vip := f.mustEnsure(lbtest.Service(fmt.Sprintf("svc-%d", i)))
		want := lb.Ranked(vip, all, 1)[0]
		if got := f.ann.MAC(vip).String(); got != macOfNode(want) {
			t.Fatalf("%s answered by %s, want %s (%s)", vip, got, want, macOfNode(want))
		}
		placed[vip] = want
		svcs = append(svcs, lbtest.Service(fmt.Sprintf("svc-%d", i), lbtest.WithStatusIP(vip.String())))
	}
	if len(f.ann.Answering()) != 12 {
		t.Fatalf("%d VIPs answered, want 12", len(f.ann.Answering()))
	}
	var objs []runtime.Object
	for _, s := range svcs {
		objs = append(objs, s)
	}
	g := newLBFixture(t, "10.0.0.0/27", objs...).start()
	g.WaitFor("every VIP placed after the restart", func() bool { return len(g.ann.Answering()) == 12 })
	for vip, node := range placed {
		if got := g.ann.MAC(vip).String(); got != macOfNode(node) {
			t.Errorf("after a restart %s is answered by %s, want %s as before", vip, got, node)
		}
	}
}

// TestPlacementKeepsVIPsWhileHypervisorUnavailable: libvirtd restarting
// (guests keep running) while Node events arrive withdraws nothing and moves
// nothing; once it answers again placement is recomputed.
func TestPlacementKeepsVIPsWhileHypervisorUnavailable(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.20").start()
	var vips []netip.Addr
	for i := range 4 {
		vips = append(vips, f.mustEnsure(lbtest.Service(fmt.Sprintf("svc-%d", i))))
	}
	before := f.ann.Answering()
	sets := len(f.ann.Sets())

	f.hv.SetDown(true)
	f.touchNodes("during")
	f.lb.place.Sync(f.ctx, nil)
	time.Sleep(100 * time.Millisecond) // let the loop's own passes run too
	for _, vip := range vips {
		if got := f.ann.MAC(vip); got.String() != before[vip].String() {
			t.Errorf("while libvirtd was down %s went from %s to %v", vip, before[vip], got)
		}
		if f.ann.Removed(vip) {
			t.Errorf("while libvirtd was down %s was withdrawn", vip)
		}
	}
	// A new Service meanwhile still gets a node from the last known facts.
	extra := f.mustEnsure(lbtest.Service("extra"))
	if f.ann.MAC(extra) == nil {
		t.Error("a new VIP was not announced while libvirtd was down")
	}

	f.hv.SetDown(false)
	f.WaitFor("a pass after reconnect", func() bool { return len(f.ann.Sets()) > sets })
	for _, vip := range vips {
		if got := f.ann.MAC(vip); got.String() != before[vip].String() {
			t.Errorf("after libvirtd returned %s went from %s to %v", vip, before[vip], got)
		}
	}
	if n := f.Count(v1.EventTypeNormal, placement.ReasonVIPMoved) + f.Count(v1.EventTypeWarning, placement.ReasonNoNodeForVIP); n != 0 {
		t.Errorf("%d moves or withdrawals across the restart: %q", n, f.Drain())
	}
}

// TestPausedDomainKeepsItsVIPs: a paused domain (snapshot, migration) keeps
// its node eligible; when it resumes nothing waits for a Node report.
func TestPausedDomainKeepsItsVIPs(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12").start()
	vip := f.mustEnsure(lbtest.Service("web"))
	first, _ := lbtest.NodeOf(f.ann.MAC(vip))

	f.hv.SetState(first.Name, libvirtcloud.StatePaused)
	f.lb.place.Sync(f.ctx, nil)
	f.hv.SetState(first.Name, libvirtcloud.StateRunning)
	f.lb.place.Sync(f.ctx, nil)
	time.Sleep(50 * time.Millisecond)
	if got := f.ann.MAC(vip); got.String() != first.MAC.String() {
		t.Fatalf("after pause and resume %s is answered by %v, want %s still", vip, got, first.Name)
	}
	if f.ann.Removed(vip) {
		t.Error("the VIP was withdrawn during the pause")
	}
	// The other node pauses and resumes, then the first one dies: the VIP
	// goes to the other node at once, with no report of its since.
	other := lbtest.OtherNode(first)
	f.hv.SetState(other.Name, libvirtcloud.StatePaused)
	f.hv.SetState(other.Name, libvirtcloud.StateRunning)
	f.hv.SetState(first.Name, libvirtcloud.StateShutOff)
	f.WaitFor("move to "+other.Name, func() bool { return f.ann.MAC(vip).String() == other.MAC.String() })
}

// TestRestartBeforeLeadingWaitsForReport: a domain that went down and came
// back while this process was not yet placing VIPs (a new leader waits for
// the lease while the cache already sees events) does not answer until its
// Node reports again: its Ready is still the one from before the restart.
func TestRestartBeforeLeadingWaitsForReport(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.15")
	restarted := testNodes[0]
	f.hv.SetState(restarted.Name, libvirtcloud.StateShutOff)
	f.hv.SetState(restarted.Name, libvirtcloud.StateRunning)
	f.start()
	var vips []netip.Addr
	for i := range 6 {
		vips = append(vips, f.mustEnsure(lbtest.Service(fmt.Sprintf("web-%d", i))))
	}
	for _, vip := range vips {
		if got := f.ann.MAC(vip); got.String() == restarted.MAC.String() {
			t.Errorf("%s handed to %s, whose domain restarted and whose Node has not reported since", vip, restarted.Name)
		}
	}
	// Its kubelet reports: the VIPs rendezvous gives it go there.
	n := restarted.Object()
	n.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(time.Now())
	if _, err := f.client.CoreV1().Nodes().UpdateStatus(f.ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.WaitFor("a VIP on "+restarted.Name, func() bool {
		for _, vip := range vips {
			if f.ann.MAC(vip).String() == restarted.MAC.String() {
				return true
			}
		}
		return false
	})
}
