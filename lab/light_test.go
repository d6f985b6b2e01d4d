package lab

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
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
	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/lab/kubeletsim"
)

func TestLightNodeName(t *testing.T) {
	for _, tt := range []struct {
		i, n int
		want string
	}{
		{1, 1, "lab-node-1"},
		{7, 200, "lab-node-007"},
		{200, 200, "lab-node-200"},
		{42, 1000, "lab-node-0042"},
		{10000, 10000, "lab-node-10000"},
	} {
		if got := lightNodeName(tt.i, tt.n); got != tt.want {
			t.Errorf("lightNodeName(%d, %d) = %q, want %q", tt.i, tt.n, got, tt.want)
		}
	}
}

// The fixture must load in the test driver with one running domain per
// node, named and identified as the simulator's nodes, each with its own
// guest-agent address (the CCM's only address source in light mode).
func TestWriteFixture(t *testing.T) {
	const n = 120
	path := filepath.Join(t.TempDir(), "fixture.xml")
	if err := writeFixture(path, n); err != nil {
		t.Fatal(err)
	}
	c, err := libvirt.NewConnect("test://" + path)
	if err != nil {
		t.Fatalf("test driver rejects the fixture: %v", err)
	}
	defer c.Close()
	doms, err := c.ListAllDomains(libvirt.CONNECT_LIST_DOMAINS_RUNNING)
	if err != nil {
		t.Fatal(err)
	}
	if len(doms) != n {
		t.Fatalf("%d running domains, want %d", len(doms), n)
	}
	seen := map[string]string{}
	for _, d := range doms {
		name, _ := d.GetName()
		uuid, _ := d.GetUUIDString()
		var i int
		if _, err := fmt.Sscanf(strings.TrimPrefix(name, NodePrefix), "%d", &i); err != nil || lightNodeName(i, n) != name {
			t.Errorf("domain %q is not named like a simulated node", name)
		}
		if uuid != fixtureUUID(i) {
			t.Errorf("domain %s UUID %s, want %s", name, uuid, fixtureUUID(i))
		}
		ifaces, err := d.ListAllInterfaceAddresses(libvirt.DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT)
		if err != nil || len(ifaces) != 1 || len(ifaces[0].Addrs) == 0 {
			t.Fatalf("domain %s agent addresses: %+v %v", name, ifaces, err)
		}
		addr := ifaces[0].Addrs[0].Addr
		if other, dup := seen[addr]; dup {
			t.Errorf("domains %s and %s share the agent address %s", name, other, addr)
		}
		seen[addr] = name
		d.Free()
	}
}

func TestHeartbeatFor(t *testing.T) {
	for _, tt := range []struct {
		n              int
		heartbeat, gp  time.Duration
		maxRenewPerSec float64
	}{
		{1, 10 * time.Second, 50 * time.Second, 1},
		{200, 10 * time.Second, 50 * time.Second, 20},
		{1000, 40 * time.Second, 160 * time.Second, 25},
		{10000, 5 * time.Minute, 20 * time.Minute, 34},
	} {
		hb := heartbeatFor(tt.n)
		if hb != tt.heartbeat || gracePeriodFor(hb) != tt.gp {
			t.Errorf("n=%d: heartbeat %s grace %s, want %s %s", tt.n, hb, gracePeriodFor(hb), tt.heartbeat, tt.gp)
		}
		if rate := float64(tt.n) / hb.Seconds(); rate > tt.maxRenewPerSec {
			t.Errorf("n=%d: %.1f renewals/s", tt.n, rate)
		}
	}
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
		done <- Simulate(ctx, SimOptions{Client: client, Nodes: n, Heartbeat: 120 * time.Millisecond, Workers: 3})
	}()

	poll := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	poll("nodes and leases registered", func() bool {
		nodes, _ := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		leases, _ := client.CoordinationV1().Leases(kubeletsim.NodeLeaseNamespace).List(ctx, metav1.ListOptions{})
		return len(nodes.Items) == n && len(leases.Items) == n
	})
	for i := 1; i <= n; i++ {
		node, err := client.CoreV1().Nodes().Get(ctx, lightNodeName(i, n), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if node.Status.NodeInfo.SystemUUID != fixtureUUID(i) || !tainted(node, kubeletsim.UninitializedTaint.Key) ||
			!nodeIsReady(node) || node.Spec.ProviderID != "" {
			t.Errorf("node %s is not registered like a kubelet with --cloud-provider=external: %+v", node.Name, node)
		}
	}
	// About n renewals per heartbeat, spread over it.
	poll("two rounds of renewals", func() bool { return patches.Load() >= 2*n })
	lease, err := client.CoordinationV1().Leases(kubeletsim.NodeLeaseNamespace).Get(ctx, lightNodeName(1, n), metav1.GetOptions{})
	if err != nil || time.Since(lease.Spec.RenewTime.Time) > time.Second {
		t.Errorf("lease of node 1 not renewed: %+v %v", lease, err)
	}

	// A deleted Node (and its Lease, which the garbage collector would
	// remove) is registered again.
	name := lightNodeName(5, n)
	if err := client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.CoordinationV1().Leases(kubeletsim.NodeLeaseNamespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
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

func TestCountLight(t *testing.T) {
	ready := []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}
	nodes := []v1.Node{
		{ // initialized and Ready
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1.LabelTopologyZone: lightZone}},
			Spec:       v1.NodeSpec{ProviderID: "libvirt://x"},
			Status:     v1.NodeStatus{Conditions: ready},
		},
		{ // still tainted
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1.LabelTopologyZone: lightZone}},
			Spec:       v1.NodeSpec{ProviderID: "libvirt://y", Taints: []v1.Taint{kubeletsim.UninitializedTaint}},
			Status:     v1.NodeStatus{Conditions: ready},
		},
		{ // no zone yet, not Ready
			Spec: v1.NodeSpec{ProviderID: "libvirt://z"},
		},
	}
	got := countLight(nodes)
	if want := (lightProgress{registered: 3, initialized: 1, ready: 2}); got != want {
		t.Errorf("countLight = %+v, want %+v", got, want)
	}
}

func TestWriteSummary(t *testing.T) {
	s := &Status{}
	for i := 1; i <= 25; i++ {
		ready := "True"
		if i == 3 {
			ready = "False"
		}
		s.Nodes = append(s.Nodes, NodeStatus{Name: lightNodeName(i, 25), Ready: ready, ProviderID: "libvirt://" + fixtureUUID(i)})
	}
	var b bytes.Buffer
	s.WriteSummary(&b, 20)
	out := b.String()
	for _, want := range []string{"25 nodes: 24 Ready, 25 with a providerID; the first 20 (labcloud status lists them all):", "lab-node-20 "} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "lab-node-21") {
		t.Errorf("summary shows more than 20 rows:\n%s", out)
	}
	b.Reset()
	(&Status{Nodes: s.Nodes[:2]}).WriteSummary(&b, 20)
	if strings.Contains(b.String(), "nodes:") || !strings.Contains(b.String(), "lab-node-02") {
		t.Errorf("a small lab gets the plain table:\n%s", b.String())
	}
}
