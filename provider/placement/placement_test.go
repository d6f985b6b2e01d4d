package placement

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
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/metrics"
	"github.com/labcloud/labcloud/provider/internal/lbtest"
)

// TestPlacementWaitsForItsInformers: a pass asked for before placement's
// informers have synced (a new leader's service controller syncs once its
// own have) changes nothing: a partial cache would withdraw VIPs.
func TestPlacementWaitsForItsInformers(t *testing.T) {
	f := newFixture(t, "10.0.0.10-10.0.0.20")
	p := f.placementOnly()
	vip := netip.MustParseAddr("10.0.0.10")
	if err := f.alloc.Assign("default/svc", vip, lb.Request{}); err != nil {
		t.Fatal(err)
	}
	p.Sync(f.ctx, nil)
	before := f.ann.MAC(vip)
	if before == nil {
		t.Fatalf("%s not placed", vip)
	}
	synced := false
	p.synced = append(p.synced, func() bool { return synced })
	// A change a pass acts on: the VIP is no longer held.
	f.alloc.Release("default/svc")
	p.Sync(f.ctx, nil)
	if got := f.ann.MAC(vip); got.String() != before.String() || f.ann.Removed(vip) {
		t.Fatalf("before the informers synced %s went from %s to %v (removed: %v)", vip, before, got, f.ann.Removed(vip))
	}
	synced = true
	p.Sync(f.ctx, nil)
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
	f := newFixture(t, "10.0.0.10-10.0.0.40")
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
	wg.Go(func() { p.Sync(f.ctx, nil) })
	f.WaitFor("the first pass", func() bool { return f.ann.Held() == 1 })

	const n = 20
	vips := make([]netip.Addr, n)
	for i := range n {
		svc := lbtest.Service(fmt.Sprintf("burst-%d", i))
		vips[i] = netip.AddrFrom4([4]byte{10, 0, 0, byte(11 + i)})
		if err := f.alloc.Assign(key(svc), vips[i], lb.Request{}); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			p.Sync(f.ctx, svc)
			if f.ann.MAC(vips[i]) == nil {
				t.Errorf("sync of %s returned before %s was announced", svc.Name, vips[i])
			}
		})
	}
	f.WaitFor("every call waiting for the next pass", func() bool {
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
		if !slices.ContainsFunc(f.Drain(), func(e string) bool {
			return strings.HasPrefix(e, "Normal "+ReasonVIPAnnounced+" "+vips[i].String()+" ")
		}) {
			t.Errorf("no %s event for %s (%s) from its call's copy; events: %q", ReasonVIPAnnounced, vips[i], name, f.Drain())
		}
	}
}

// TestLocalPolicyDampsEndpointFlaps: a tenant flipping its Local Service's
// EndpointSlice between two nodes 20 times moves its VIP at the first flip
// and then at most once per damping, not once per flip; when the damping
// ends, with nothing else to start a pass, the VIP goes to the node with
// the endpoint.
func TestLocalPolicyDampsEndpointFlaps(t *testing.T) {
	const damping = 500 * time.Millisecond
	a, b := testNodes[0], testNodes[1]
	f := newFixture(t, "10.0.0.10-10.0.0.12", lbtest.Service("web", lbtest.LocalPolicy), lbtest.EndpointSlice("web", map[string]bool{a.Name: true}))
	f.p.localDamping = damping
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
	f.WaitFor("the first flip's move to "+b.Name, func() bool { return f.ann.MAC(vip).String() == b.MAC.String() })
	on := b
	for range 19 {
		on = lbtest.OtherNode(on)
		flip(on)
		time.Sleep(10 * time.Millisecond)
	}
	flipping := time.Since(start)
	f.WaitFor("the VIP on "+on.Name+" once the damping ends", func() bool { return f.ann.MAC(vip).String() == on.MAC.String() })
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
	if n := f.Count(v1.EventTypeNormal, ReasonVIPMoved); n != moves {
		t.Errorf("%d %s events for %d moves", n, ReasonVIPMoved, moves)
	}
}

// TestLocalPolicyFailoverIsNotDamped: a damped VIP stays on its node while
// that node lives, and leaves it at once when its domain stops.
func TestLocalPolicyFailoverIsNotDamped(t *testing.T) {
	a, b := testNodes[0], testNodes[1]
	f := newFixture(t, "10.0.0.10-10.0.0.12", lbtest.Service("web", lbtest.LocalPolicy), lbtest.EndpointSlice("web", map[string]bool{a.Name: true}))
	f.p.localDamping = time.Hour
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
	f.p.Sync(f.ctx, nil)
	if got := f.ann.MAC(vip); got.String() != a.MAC.String() {
		t.Fatalf("within the damping the VIP left live %s for %v", a.Name, got)
	}

	f.hv.SetState(a.Name, libvirtcloud.StateShutOff)
	f.WaitFor("failover to "+b.Name, func() bool { return f.ann.MAC(vip).String() == b.MAC.String() })
}

func TestLoadBalancerLocalPolicyUsesNodesWithReadyEndpoints(t *testing.T) {
	for _, n := range testNodes {
		t.Run("endpoint on "+n.Name, func(t *testing.T) {
			other := lbtest.OtherNode(n)
			f := newFixture(t, "10.0.0.10-10.0.0.12", lbtest.Service("web", lbtest.LocalPolicy),
				lbtest.EndpointSlice("web", map[string]bool{n.Name: true, other.Name: false}))
			f.p.localDamping = time.Millisecond // TestLocalPolicyDampsEndpointFlaps tests it
			f.start()
			vip := f.mustEnsure(lbtest.Service("web", lbtest.LocalPolicy))
			if got := f.ann.MAC(vip); got.String() != n.MAC.String() {
				t.Fatalf("answered by %v, want %s, the only node with a ready endpoint", got, n.Name)
			}
			moves := lbtest.Counter(t, metrics.VIPMoves.WithLabelValues(metrics.MoveEndpoints))

			// The endpoint moves: so does the VIP, without a service sync.
			moved := lbtest.EndpointSlice("web", map[string]bool{n.Name: false, other.Name: true})
			if _, err := f.client.DiscoveryV1().EndpointSlices("default").Update(f.ctx, moved, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			f.WaitFor("follow the endpoint to "+other.Name, func() bool { return f.ann.MAC(vip).String() == other.MAC.String() })
			if n := moves(); n != 1 {
				t.Errorf("%v moves with reason %s, want 1", n, metrics.MoveEndpoints)
			}

			// No ready endpoint anywhere: nobody answers.
			none := lbtest.EndpointSlice("web", map[string]bool{n.Name: false, other.Name: false})
			if _, err := f.client.DiscoveryV1().EndpointSlices("default").Update(f.ctx, none, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			f.WaitFor("VIP withdrawn", func() bool { return f.ann.MAC(vip) == nil })
		})
	}

	// Cluster policy ignores endpoints.
	f := newFixture(t, "10.0.0.10-10.0.0.12", lbtest.Service("web"),
		lbtest.EndpointSlice("web", map[string]bool{testNodes[0].Name: false, testNodes[1].Name: false})).start()
	vip := f.mustEnsure(lbtest.Service("web"))
	if _, ok := lbtest.NodeOf(f.ann.MAC(vip)); !ok {
		t.Fatalf("Cluster policy: answered by %v, want any node", f.ann.MAC(vip))
	}
}
