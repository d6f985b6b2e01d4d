package placement

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/labcloud/labcloud/provider/internal/lbtest"
)

func TestEndpointAgesServing(t *testing.T) {
	const warmup = 10 * time.Second
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	set := func(nodes ...string) map[string]bool {
		m := map[string]bool{}
		for _, n := range nodes {
			m[n] = true
		}
		return m
	}
	type step struct {
		at      time.Duration // after t0
		ready   map[string]bool
		serving []string
		next    time.Duration // after t0; -1: none waits
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"endpoints there at first sight serve at once", []step{
			{0, set("a", "b"), []string{"a", "b"}, -1},
		}},
		{"a new endpoint waits while an old one serves", []step{
			{0, set("a"), []string{"a"}, -1},
			{2 * time.Second, set("a", "b"), []string{"a"}, 12 * time.Second},
			{11 * time.Second, set("a", "b"), []string{"a"}, 12 * time.Second},
			{12 * time.Second, set("a", "b"), []string{"a", "b"}, -1},
		}},
		{"a Service with no endpoint at first sight: its first serve at once", []step{
			{0, set(), nil, -1},
			{time.Second, set("a"), []string{"a"}, -1},
			{2 * time.Second, set("a", "b"), []string{"a"}, 12 * time.Second},
		}},
		{"every endpoint replaced at once: the oldest new ones serve", []step{
			{0, set("a"), []string{"a"}, -1},
			{time.Second, set(), nil, -1},
			{2 * time.Second, set("b"), []string{"b"}, -1},
			{3 * time.Second, set("b", "c"), []string{"b"}, 13 * time.Second},
		}},
		{"a node that loses its endpoint and gains a new one waits again", []step{
			{0, set("a", "b"), []string{"a", "b"}, -1},
			{time.Second, set("b"), []string{"b"}, -1},
			{20 * time.Second, set("a", "b"), []string{"b"}, 30 * time.Second},
			{30 * time.Second, set("a", "b"), []string{"a", "b"}, -1},
		}},
		{"the old endpoint leaves during a warm-up: the waiting node serves", []step{
			{0, set("a"), []string{"a"}, -1},
			{time.Second, set("a", "b"), []string{"a"}, 11 * time.Second},
			{2 * time.Second, set("b"), []string{"b"}, -1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ages := endpointAges{}
			for i, s := range tc.steps {
				got, next := ages.serving("default/web", s.ready, t0.Add(s.at), warmup)
				if names := slices.Sorted(maps.Keys(got)); !slices.Equal(names, s.serving) {
					t.Errorf("step %d (%v): serving %v, want %v", i, s.at, names, s.serving)
				}
				want := time.Time{}
				if s.next >= 0 {
					want = t0.Add(s.next)
				}
				if !next.Equal(want) {
					t.Errorf("step %d (%v): next warm-up end %v, want %v", i, s.at, next, want)
				}
			}
		})
	}
}

func TestEndpointAgesForgetsServicesNoLongerSeen(t *testing.T) {
	ages := endpointAges{}
	now := time.Now()
	ages.serving("default/a", map[string]bool{"n1": true}, now, time.Second)
	ages.serving("default/b", map[string]bool{"n1": true}, now, time.Second)
	ages.keepOnly(map[string]map[string]bool{"default/b": {"n1": true}})
	if _, ok := ages["default/a"]; ok {
		t.Error("default/a kept after a pass that did not see it")
	}
	// Seen again later, it is a first sight: its endpoints count as old.
	got, _ := ages.serving("default/a", map[string]bool{"n1": true, "n2": true}, now.Add(time.Millisecond), time.Second)
	if len(got) != 2 {
		t.Errorf("a Service seen anew serves %v, want both nodes", got)
	}
}

// TestLocalEndpointWarmupHoldsNewNodes: Local-policy Services answered by
// node-a gain a ready endpoint on node-b; none of their VIPs goes to node-b
// before its warm-up ends, and those that rank node-b first go there when
// it does, with nothing else to start a pass.
func TestLocalEndpointWarmupHoldsNewNodes(t *testing.T) {
	const warmup = 1500 * time.Millisecond
	a, b := testNodes[0], testNodes[1]
	const services = 8
	var objects []runtime.Object
	for i := range services {
		name := fmt.Sprintf("web-%d", i)
		objects = append(objects, lbtest.Service(name, lbtest.LocalPolicy), lbtest.EndpointSlice(name, map[string]bool{a.Name: true}))
	}
	f := newFixture(t, "10.0.0.10-10.0.0.30", objects...)
	f.p.localDamping = time.Millisecond // TestLocalPolicyDampsEndpointFlaps tests it
	f.p.localWarmup = warmup
	f.start()
	var vips []netip.Addr
	for i := range services {
		vip := f.mustEnsure(lbtest.Service(fmt.Sprintf("web-%d", i), lbtest.LocalPolicy))
		if got := f.ann.MAC(vip); got.String() != a.MAC.String() {
			t.Fatalf("%s answered by %v, want %s, the only node with an endpoint", vip, got, a.Name)
		}
		vips = append(vips, vip)
	}
	onB := func() (n int) {
		for _, vip := range vips {
			if f.ann.MAC(vip).String() == b.MAC.String() {
				n++
			}
		}
		return n
	}

	gained := time.Now()
	for i := range services {
		es := lbtest.EndpointSlice(fmt.Sprintf("web-%d", i), map[string]bool{a.Name: true, b.Name: true})
		if _, err := f.client.DiscoveryV1().EndpointSlices("default").Update(f.ctx, es, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for time.Since(gained) < warmup-300*time.Millisecond {
		f.p.Sync(f.ctx, nil)
		if n := onB(); n > 0 {
			t.Fatalf("%d VIP(s) on %s %v after it gained its endpoints, within its %v warm-up", n, b.Name, time.Since(gained).Round(time.Millisecond), warmup)
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.WaitFor("a VIP on "+b.Name+" once its warm-up ends", func() bool { return onB() > 0 })
	if took := time.Since(gained); took < warmup {
		t.Errorf("a VIP went to %s %v after its endpoints, before its %v warm-up ended", b.Name, took, warmup)
	}
}
