package kubeletsim

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
)

func name(i int) string { return fmt.Sprintf("sim-%02d", i) }
func uuid(i int) string { return fmt.Sprintf("1abc0000-0000-4000-8000-%012d", i) }

func identity(i int) (string, string) { return name(i), uuid(i) }

func ready(n *v1.Node) bool {
	return slices.ContainsFunc(n.Status.Conditions, func(c v1.NodeCondition) bool {
		return c.Type == v1.NodeReady && c.Status == v1.ConditionTrue
	})
}

func TestRenewalsDue(t *testing.T) {
	for _, tt := range []struct {
		elapsed, interval time.Duration
		n                 int
		want              int64
	}{
		{0, 10 * time.Second, 100, 1},                     // the first at once
		{99 * time.Millisecond, 10 * time.Second, 100, 1}, // one every 100 ms
		{100 * time.Millisecond, 10 * time.Second, 100, 2},
		{10 * time.Second, 10 * time.Second, 100, 101}, // one round done, the next begun
		{25 * time.Second, 10 * time.Second, 3, 8},
		{365 * 24 * time.Hour, time.Minute, 10000, 365*24*60*10000 + 1}, // no overflow
		{time.Second, 0, 5, 5001},                                       // a zero interval is 1 ms
		{-time.Second, time.Second, 5, 0},
		{time.Second, time.Second, 0, 0},
	} {
		if got := renewalsDue(tt.elapsed, tt.interval, tt.n); got != tt.want {
			t.Errorf("renewalsDue(%s, %s, %d) = %d, want %d", tt.elapsed, tt.interval, tt.n, got, tt.want)
		}
	}
}

func TestSimulate(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := fake.NewClientset()
	var patches atomic.Int64
	client.PrependReactor("patch", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		patches.Add(1)
		return false, nil, nil
	})
	const n = 12
	done := make(chan error, 1)
	go func() {
		done <- Simulate(ctx, SimOptions{Client: client, Nodes: n, Identity: identity, Heartbeat: 120 * time.Millisecond, Workers: 3})
	}()

	poll := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	poll("nodes and leases registered", func() bool {
		nodes, _ := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		leases, _ := client.CoordinationV1().Leases(NodeLeaseNamespace).List(ctx, metav1.ListOptions{})
		return len(nodes.Items) == n && len(leases.Items) == n
	})
	for i := 1; i <= n; i++ {
		node, err := client.CoreV1().Nodes().Get(ctx, name(i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if node.Status.NodeInfo.SystemUUID != uuid(i) || !slices.ContainsFunc(node.Spec.Taints, func(t v1.Taint) bool { return t.Key == UninitializedTaint.Key }) ||
			!ready(node) || node.Spec.ProviderID != "" {
			t.Errorf("node %s is not registered like a kubelet with --cloud-provider=external: %+v", node.Name, node)
		}
	}
	// About n renewals per heartbeat, spread over it.
	poll("two rounds of renewals", func() bool { return patches.Load() >= 2*n })
	lease, err := client.CoordinationV1().Leases(NodeLeaseNamespace).Get(ctx, name(1), metav1.GetOptions{})
	if err != nil || time.Since(lease.Spec.RenewTime.Time) > time.Second {
		t.Errorf("lease of node 1 not renewed: %+v %v", lease, err)
	}

	// A deleted Node (and its Lease, which the garbage collector would
	// remove) is registered again.
	name := name(5)
	if err := client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.CoordinationV1().Leases(NodeLeaseNamespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("deleted node registered again", func() bool {
		_, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		return err == nil
	})

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Simulate = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Simulate did not return after the context ended")
	}
}
