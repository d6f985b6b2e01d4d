package placement

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics/testutil"

	"github.com/labcloud/labcloud/metrics"
	"github.com/labcloud/labcloud/provider/internal/lbtest"
)

// TestPlacementInputsChanged: only what a pass reads of a Node starts one.
func TestPlacementInputsChanged(t *testing.T) {
	base := testNodes[0].Object()
	cases := []struct {
		name   string
		change func(n *v1.Node)
		want   bool
	}{
		{"nothing", func(*v1.Node) {}, false},
		{"an annotation (kube-controller-manager's TTL)", func(n *v1.Node) {
			n.Annotations = map[string]string{"node.alpha.kubernetes.io/ttl": "30"}
		}, false},
		{"another label", func(n *v1.Node) { n.Labels = map[string]string{"team": "a"} }, false},
		{"a heartbeat", func(n *v1.Node) {
			n.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(time.Now().Add(time.Minute))
		}, false},
		{"Ready status", func(n *v1.Node) { n.Status.Conditions[0].Status = v1.ConditionFalse }, true},
		{"Ready transition time", func(n *v1.Node) {
			n.Status.Conditions[0].LastTransitionTime = metav1.NewTime(time.Now().Add(time.Minute))
		}, true},
		{"exclusion label", func(n *v1.Node) { n.Labels = map[string]string{excludeLabel: ""} }, true},
		{"deletion", func(n *v1.Node) { now := metav1.Now(); n.DeletionTimestamp = &now }, true},
		{"provider ID", func(n *v1.Node) { n.Spec.ProviderID = "libvirt://other" }, true},
		{"system UUID", func(n *v1.Node) { n.Status.NodeInfo.SystemUUID = "other" }, true},
		{"addresses", func(n *v1.Node) {
			n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: "192.0.2.9"})
		}, true},
	}
	for _, c := range cases {
		cur := base.DeepCopy()
		c.change(cur)
		if got := placementInputsChanged(base, cur); got != c.want {
			t.Errorf("%s: placementInputsChanged = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestNodeUpdatesThatChangeNothingStartNoPass: with 1000 Nodes every pass
// takes every Node and dumps every VIP route, so a Node update that changes
// nothing placement reads must not start one; one that does still does.
func TestNodeUpdatesThatChangeNothingStartNoPass(t *testing.T) {
	f := newFixture(t, "10.0.0.10-10.0.0.12").start()
	f.mustEnsure(lbtest.Service("web"))
	passes := passCounter(t, f)
	for i := range 20 {
		n, err := f.client.CoreV1().Nodes().Get(f.ctx, testNodes[i%len(testNodes)].Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Annotations = map[string]string{"node.alpha.kubernetes.io/ttl": fmt.Sprint(i)}
		if _, err := f.client.CoreV1().Nodes().Update(f.ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if got := passes(); got != 0 {
		t.Errorf("20 annotation updates started %d placement passes, want 0", got)
	}
	f.SetReady(testNodes[0], v1.ConditionFalse, time.Now())
	f.WaitFor("a pass for a Node that went NotReady", func() bool { return passes() > 0 })
}

// passCounter waits until the fixture's placement is idle and returns how
// many passes have run since.
func passCounter(t *testing.T, f *fixture) func() uint64 {
	t.Helper()
	read := func() uint64 {
		n, err := testutil.GetHistogramMetricCount(metrics.PlacementPassSeconds.ObserverMetric)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The loop's own first pass follows its informers' sync, polled every
	// 100 ms: quiet for 300 ms is after it.
	f.WaitFor("placement idle", func() bool {
		before := read()
		time.Sleep(300 * time.Millisecond)
		return read() == before
	})
	start := read()
	return func() uint64 { return read() - start }
}

// TestEndpointSliceUpdatesThatChangeNothingStartNoPass: EndpointSlices
// start a pass only for Services with externalTrafficPolicy Local, and only
// when the nodes holding a ready endpoint change.
func TestEndpointSliceUpdatesThatChangeNothingStartNoPass(t *testing.T) {
	a, b := testNodes[0].Name, testNodes[1].Name
	f := newFixture(t, "10.0.0.10-10.0.0.12", lbtest.Service("local", lbtest.LocalPolicy), lbtest.Service("cluster"),
		lbtest.EndpointSlice("local", map[string]bool{a: true}), lbtest.EndpointSlice("cluster", map[string]bool{a: true})).start()
	f.mustEnsure(lbtest.Service("local", lbtest.LocalPolicy))
	f.mustEnsure(lbtest.Service("cluster"))
	passes := passCounter(t, f)
	update := func(svc string, ready map[string]bool) {
		t.Helper()
		if _, err := f.client.DiscoveryV1().EndpointSlices("default").Update(f.ctx, lbtest.EndpointSlice(svc, ready), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	update("cluster", map[string]bool{a: true, b: true}) // Cluster policy: endpoints do not matter
	update("local", map[string]bool{a: true, b: false})  // a not-ready endpoint: same ready nodes
	if n := passes(); n != 0 {
		t.Errorf("EndpointSlice updates that change no Local Service's ready nodes started %d passes, want 0", n)
	}
	update("local", map[string]bool{a: true, b: true})
	f.WaitFor("a pass for a new ready node of a Local Service", func() bool { return passes() > 0 })
}
