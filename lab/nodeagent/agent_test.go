package nodeagent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
)

type agentRig struct {
	t      *testing.T
	ctx    context.Context
	client *fake.Clientset
	ifs    *fakeInterfaces
	listen *fakeListen
	done   chan error
	cancel context.CancelFunc
}

func startAgent(t *testing.T, objs ...runtime.Object) *agentRig {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	r := &agentRig{t: t, ctx: ctx, cancel: cancel, client: fake.NewClientset(objs...), ifs: newFakeInterfaces(), done: make(chan error, 1)}
	// The fake assigns no UIDs; the API server does.
	uids := 0
	r.client.PrependReactor("create", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if o, ok := action.(k8stesting.CreateAction).GetObject().(metav1.Object); ok && o.GetUID() == "" {
			uids++
			o.SetUID(types.UID(fmt.Sprintf("uid-%d", uids)))
		}
		return false, nil, nil
	})
	// A VIP left over from an earlier run.
	if err := r.ifs.AddAddr("lo", netip.MustParsePrefix("192.168.100.99/32")); err != nil {
		t.Fatal(err)
	}
	r.listen = &fakeListen{ifs: r.ifs, at: map[netip.AddrPort]string{}}
	a, err := New(Options{
		NodeName:           "node-1",
		Labels:             map[string]string{"lab.example/pool": "a"},
		Client:             r.client,
		Interfaces:         r.ifs,
		Host:               testHost,
		Listen:             r.listen.listen,
		LeaseRenewInterval: 50 * time.Millisecond,
		ResyncInterval:     time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(r.stop)
	return r
}

// stop ends the agent and checks that Run returns.
func (r *agentRig) stop() {
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			r.t.Errorf("Run returned %v", err)
		}
		r.done <- nil
	case <-time.After(10 * time.Second):
		r.t.Fatal("Run did not return after cancel")
	}
}

func (r *agentRig) eventually(what string, cond func() bool) {
	r.t.Helper()
	err := wait.PollUntilContextTimeout(r.ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		r.t.Fatalf("%s: %v", what, err)
	}
}

func (r *agentRig) node() *v1.Node {
	n, err := r.client.CoreV1().Nodes().Get(r.ctx, "node-1", metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return n
}

func TestAgentRegistersAndServes(t *testing.T) {
	r := startAgent(t)

	r.eventually("node registered", func() bool { return r.node() != nil })
	n := r.node()
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0] != UninitializedTaint {
		t.Errorf("taints = %v", n.Spec.Taints)
	}
	if n.Status.NodeInfo.SystemUUID != testHost.SystemUUID || n.Spec.ProviderID != "" {
		t.Errorf("systemUUID %q providerID %q", n.Status.NodeInfo.SystemUUID, n.Spec.ProviderID)
	}
	if n.Labels["lab.example/pool"] != "a" || n.Labels[v1.LabelHostname] != "node-1" {
		t.Errorf("labels = %v", n.Labels)
	}

	r.eventually("lease held and renewed", func() bool {
		l, err := r.client.CoordinationV1().Leases(NodeLeaseNamespace).Get(r.ctx, "node-1", metav1.GetOptions{})
		return err == nil && *l.Spec.HolderIdentity == "node-1" && len(l.OwnerReferences) == 1 &&
			l.OwnerReferences[0].UID == n.UID && time.Since(l.Spec.RenewTime.Time) < time.Second
	})

	// The stale VIP goes once services are known.
	r.eventually("stale VIP removed", func() bool { return !r.ifs.has("lo", netip.MustParseAddr("192.168.100.99")) })

	// Pod CIDR assigned by kube-controller-manager.
	n = r.node()
	n.Spec.PodCIDR, n.Spec.PodCIDRs = "10.244.1.0/24", []string{"10.244.1.0/24"}
	if _, err := r.client.CoreV1().Nodes().Update(r.ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.eventually("pod address on pod0", func() bool {
		return slices.Equal(r.ifs.get(PodInterface), pfx("10.244.1.1/24", "fe80::1/64"))
	})

	// A LoadBalancer Service gets an IP.
	svc := lbService("web", []v1.ServicePort{tcp(80), {Port: 53, Protocol: v1.ProtocolUDP}},
		v1.LoadBalancerIngress{IP: "192.168.100.10"})
	if _, err := r.client.CoreV1().Services("default").Create(r.ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vip10 := netip.MustParseAddrPort("192.168.100.10:80")
	r.eventually("VIP on lo and served", func() bool {
		if !r.ifs.has("lo", vip10.Addr()) || r.listen.addr(vip10) == "" {
			return false
		}
		body, err := get(t, r.listen.addr(vip10))
		return err == nil && body == "node-1\n"
	})

	// The IP changes.
	svc.Status.LoadBalancer.Ingress[0].IP = "192.168.100.11"
	if _, err := r.client.CoreV1().Services("default").UpdateStatus(r.ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	vip11 := netip.MustParseAddrPort("192.168.100.11:80")
	r.eventually("new VIP served, old one gone", func() bool {
		if r.ifs.has("lo", vip10.Addr()) || !r.ifs.has("lo", vip11.Addr()) || r.listen.addr(vip11) == "" {
			return false
		}
		if _, err := get(t, r.listen.addr(vip10)); err == nil {
			return false
		}
		body, err := get(t, r.listen.addr(vip11))
		return err == nil && body == "node-1\n"
	})

	// The Service goes away.
	if err := r.client.CoreV1().Services("default").Delete(r.ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.eventually("VIP removed and listener closed", func() bool {
		_, err := get(t, r.listen.addr(vip11))
		return err != nil && slices.Equal(r.ifs.get("lo"), pfx("127.0.0.1/8", "::1/128"))
	})

	// The Node is deleted behind the agent's back: it registers again.
	old := r.node()
	if err := r.client.CoreV1().Nodes().Delete(r.ctx, "node-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.eventually("node registered again", func() bool {
		n := r.node()
		return n != nil && n.UID != old.UID && len(n.Spec.Taints) == 1
	})
}

func TestAgentUpdatesExistingNode(t *testing.T) {
	// Initialized by the CCM earlier: providerID set, taint gone, a label
	// missing, status stale.
	existing := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "uid-old", Labels: map[string]string{
			v1.LabelHostname: "node-1", "topology.kubernetes.io/zone": "z1",
		}},
		Spec: v1.NodeSpec{ProviderID: "libvirt://5a0e2d7c-4b1f-4e8a-9c3d-2f6b7a8c9d0e", PodCIDRs: []string{"10.244.3.0/24"}},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{
			Type: v1.NodeReady, Status: v1.ConditionUnknown, Reason: "NodeStatusUnknown",
		}}},
	}
	r := startAgent(t, existing)
	r.eventually("node updated", func() bool {
		n := r.node()
		c := findCondition(n.Status.Conditions, v1.NodeReady)
		return n.Labels[v1.LabelOSStable] == "linux" && n.Labels["lab.example/pool"] == "a" &&
			n.Status.NodeInfo.SystemUUID == testHost.SystemUUID && c != nil && c.Status == v1.ConditionTrue
	})
	n := r.node()
	if len(n.Spec.Taints) != 0 || n.Spec.ProviderID != existing.Spec.ProviderID || n.Labels["topology.kubernetes.io/zone"] != "z1" {
		t.Errorf("existing node's taints/providerID/labels changed: %+v", n)
	}
	r.eventually("pod address", func() bool {
		return slices.Equal(r.ifs.get(PodInterface), pfx("10.244.3.1/24", "fe80::1/64"))
	})
}

func TestAgentStopsWhileAPIUnreachable(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("create", "nodes", func(action k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("down")
	})
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	a, err := New(Options{NodeName: "node-1", Client: client, Interfaces: newFakeInterfaces(), Host: testHost})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	time.Sleep(1500 * time.Millisecond) // a few attempts
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil after cancel", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	creates := 0
	for _, act := range client.Actions() {
		if act.GetVerb() == "create" && act.GetResource().Resource == "nodes" {
			creates++
		}
	}
	if creates < 2 {
		t.Errorf("%d registration attempts, want retries", creates)
	}
}

func TestNewValidates(t *testing.T) {
	_, err := New(Options{})
	if err == nil {
		t.Fatal("New(empty) succeeded")
	}
	for _, field := range []string{"NodeName", "Client", "Interfaces"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error %q does not name %s", err, field)
		}
	}
}
