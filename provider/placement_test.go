package provider

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/provider/internal/lbtest"
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
	g.waitFor("every VIP placed after the restart", func() bool { return len(g.ann.Answering()) == 12 })
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
	f.lb.place.sync(f.ctx, nil)
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
	f.waitFor("a pass after reconnect", func() bool { return len(f.ann.Sets()) > sets })
	for _, vip := range vips {
		if got := f.ann.MAC(vip); got.String() != before[vip].String() {
			t.Errorf("after libvirtd returned %s went from %s to %v", vip, before[vip], got)
		}
	}
	if n := f.count(v1.EventTypeNormal, ReasonVIPMoved) + f.count(v1.EventTypeWarning, ReasonNoNodeForVIP); n != 0 {
		t.Errorf("%d moves or withdrawals across the restart: %q", n, f.drain())
	}
}

// TestPausedDomainKeepsItsVIPs: a paused domain (snapshot, migration) keeps
// its node eligible; when it resumes nothing waits for a Node report.
func TestPausedDomainKeepsItsVIPs(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12").start()
	vip := f.mustEnsure(lbtest.Service("web"))
	first, _ := lbtest.NodeOf(f.ann.MAC(vip))

	f.hv.SetState(first.Name, libvirtcloud.StatePaused)
	f.lb.place.sync(f.ctx, nil)
	f.hv.SetState(first.Name, libvirtcloud.StateRunning)
	f.lb.place.sync(f.ctx, nil)
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
	f.waitFor("move to "+other.Name, func() bool { return f.ann.MAC(vip).String() == other.MAC.String() })
}

// placementOnly starts placement's informers and nothing else: no loop,
// so passes run only when the test asks for them.
func (f *lbFixture) placementOnly() *placement {
	f.t.Helper()
	p := f.lb.place
	factory := informers.NewSharedInformerFactory(f.client, 0)
	if err := p.watch(factory, f.events.Recorder, f.client); err != nil {
		f.t.Fatal(err)
	}
	factory.Start(f.ctx.Done())
	factory.WaitForCacheSync(f.ctx.Done())
	return p
}

// TestPlacementWaitsForItsInformers: a pass asked for before placement's
// informers have synced (a new leader's service controller syncs once its
// own have) changes nothing: a partial cache would withdraw VIPs.
func TestPlacementWaitsForItsInformers(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.20")
	p := f.placementOnly()
	vip := netip.MustParseAddr("10.0.0.10")
	if err := f.lb.alloc.Assign("default/svc", vip, lb.Request{}); err != nil {
		t.Fatal(err)
	}
	p.sync(f.ctx, nil)
	before := f.ann.MAC(vip)
	if before == nil {
		t.Fatalf("%s not placed", vip)
	}
	synced := false
	p.synced = append(p.synced, func() bool { return synced })
	// A change a pass acts on: the VIP is no longer held.
	f.lb.alloc.Release("default/svc")
	p.sync(f.ctx, nil)
	if got := f.ann.MAC(vip); got.String() != before.String() || f.ann.Removed(vip) {
		t.Fatalf("before the informers synced %s went from %s to %v (removed: %v)", vip, before, got, f.ann.Removed(vip))
	}
	synced = true
	p.sync(f.ctx, nil)
	if !f.ann.Removed(vip) {
		t.Fatalf("once synced, the released %s is still answered by %v", vip, f.ann.MAC(vip))
	}
	if len(p.dampedUntil) != 0 {
		t.Errorf("the released %s's damping is still kept: %v", vip, p.dampedUntil)
	}
}

// TestSyncsDuringAPassShareTheNext: service-controller calls that arrive
// while a pass runs wait for the next pass and share it (a burst of N
// Services costs a few passes, not N); each returns only once a pass that
// began after the call has announced its VIP, with its own copy of its
// Service (these are in no cache, so the events name the calls' copies).
func TestSyncsDuringAPassShareTheNext(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.40")
	p := f.placementOnly()
	passes := func() uint64 {
		h, err := testutil.GetHistogramVecFromGatherer(legacyregistry.DefaultGatherer, "labcloud_lb_placement_pass_seconds", nil)
		if err != nil {
			t.Fatal(err)
		}
		return h.GetAggregatedSampleCount()
	}
	before := passes()

	// The first pass stops where it reads what the bridge answers, after
	// it has read the VIPs: the VIPs assigned from here on are not its.
	hold := make(chan struct{})
	f.ann.Hold(hold)
	var wg sync.WaitGroup
	wg.Go(func() { p.sync(f.ctx, nil) })
	f.waitFor("the first pass", func() bool { return f.ann.Held() == 1 })

	const n = 20
	vips := make([]netip.Addr, n)
	for i := range n {
		svc := lbtest.Service(fmt.Sprintf("burst-%d", i))
		vips[i] = netip.AddrFrom4([4]byte{10, 0, 0, byte(11 + i)})
		if err := f.lb.alloc.Assign(key(svc), vips[i], lb.Request{}); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			p.sync(f.ctx, svc)
			if f.ann.MAC(vips[i]) == nil {
				t.Errorf("sync of %s returned before %s was announced", svc.Name, vips[i])
			}
		})
	}
	f.waitFor("every call waiting for the next pass", func() bool {
		p.batchMu.Lock()
		defer p.batchMu.Unlock()
		return p.next != nil && len(p.next.given) == n
	})
	close(hold)
	wg.Wait()

	if got := passes() - before; got != 2 {
		t.Errorf("%d passes for one running and %d calls during it, want 2", got, n)
	}
	for i := range n {
		name := fmt.Sprintf("burst-%d", i)
		if !slices.ContainsFunc(f.drain(), func(e string) bool {
			return strings.HasPrefix(e, "Normal "+ReasonVIPAnnounced+" "+vips[i].String()+" ")
		}) {
			t.Errorf("no %s event for %s (%s) from its call's copy; events: %q", ReasonVIPAnnounced, vips[i], name, f.drain())
		}
	}
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
	f.waitFor("a VIP on "+restarted.Name, func() bool {
		for _, vip := range vips {
			if f.ann.MAC(vip).String() == restarted.MAC.String() {
				return true
			}
		}
		return false
	})
}

// TestLocalPolicyDampsEndpointFlaps: a tenant flipping its Local Service's
// EndpointSlice between two nodes 20 times moves its VIP at the first flip
// and then at most once per damping, not once per flip; when the damping
// ends, with nothing else to start a pass, the VIP goes to the node with
// the endpoint.
func TestLocalPolicyDampsEndpointFlaps(t *testing.T) {
	const damping = 500 * time.Millisecond
	a, b := testNodes[0], testNodes[1]
	f := newLBFixture(t, "10.0.0.10-10.0.0.12", lbtest.Service("web", lbtest.LocalPolicy), lbtest.EndpointSlice("web", map[string]bool{a.Name: true}))
	f.lb.place.localDamping = damping
	f.start()
	vip := f.mustEnsure(lbtest.Service("web", lbtest.LocalPolicy))
	if got := f.ann.MAC(vip); got.String() != a.MAC.String() {
		t.Fatalf("answered by %v, want %s, the node with the endpoint", got, a.Name)
	}
	time.Sleep(damping) // past the first announcement's damping
	sets := len(f.ann.SetsFor(vip))
	flip := func(on lbtest.Node) {
		t.Helper()
		es := lbtest.EndpointSlice("web", map[string]bool{on.Name: true, lbtest.OtherNode(on).Name: false})
		if _, err := f.client.DiscoveryV1().EndpointSlices("default").Update(f.ctx, es, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	start := time.Now()
	flip(b)
	f.waitFor("the first flip's move to "+b.Name, func() bool { return f.ann.MAC(vip).String() == b.MAC.String() })
	on := b
	for range 19 {
		on = lbtest.OtherNode(on)
		flip(on)
		time.Sleep(10 * time.Millisecond)
	}
	flipping := time.Since(start)
	f.waitFor("the VIP on "+on.Name+" once the damping ends", func() bool { return f.ann.MAC(vip).String() == on.MAC.String() })
	time.Sleep(damping) // any move still to come
	moves := len(f.ann.SetsFor(vip)) - sets
	// One move at the first flip, then one per damping begun while flipping.
	if allowed := 2 + int(flipping/damping); moves > allowed {
		t.Errorf("20 flips in %v moved the VIP %d times, want at most %d (damping %v): %q",
			flipping.Round(time.Millisecond), moves, allowed, damping, f.ann.SetsFor(vip))
	}
	if got := f.ann.MAC(vip); got.String() != on.MAC.String() {
		t.Errorf("after the flips the VIP is on %v, want %s, the node with the endpoint", got, on.Name)
	}
	if n := f.count(v1.EventTypeNormal, ReasonVIPMoved); n != moves {
		t.Errorf("%d %s events for %d moves", n, ReasonVIPMoved, moves)
	}
}

// TestLocalPolicyFailoverIsNotDamped: a damped VIP stays on its node while
// that node lives, and leaves it at once when its domain stops.
func TestLocalPolicyFailoverIsNotDamped(t *testing.T) {
	a, b := testNodes[0], testNodes[1]
	f := newLBFixture(t, "10.0.0.10-10.0.0.12", lbtest.Service("web", lbtest.LocalPolicy), lbtest.EndpointSlice("web", map[string]bool{a.Name: true}))
	f.lb.place.localDamping = time.Hour
	f.start()
	vip := f.mustEnsure(lbtest.Service("web", lbtest.LocalPolicy))
	if got := f.ann.MAC(vip); got.String() != a.MAC.String() {
		t.Fatalf("answered by %v, want %s, the node with the endpoint", got, a.Name)
	}
	es := lbtest.EndpointSlice("web", map[string]bool{a.Name: false, b.Name: true})
	if _, err := f.client.DiscoveryV1().EndpointSlices("default").Update(f.ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the loop's pass on the update
	f.lb.place.sync(f.ctx, nil)
	if got := f.ann.MAC(vip); got.String() != a.MAC.String() {
		t.Fatalf("within the damping the VIP left live %s for %v", a.Name, got)
	}

	f.hv.SetState(a.Name, libvirtcloud.StateShutOff)
	f.waitFor("failover to "+b.Name, func() bool { return f.ann.MAC(vip).String() == b.MAC.String() })
}
