package e2e

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/labcloud/labcloud/lb"
)

// waitAnnounced waits until the Service's lb.labcloud.io/Announced
// condition satisfies ok and returns it with the Service.
func waitAnnounced(t testing.TB, name, what string, timeout time.Duration, ok func(metav1.Condition) bool) (metav1.Condition, *v1.Service) {
	t.Helper()
	var (
		last *metav1.Condition
		svc  *v1.Service
	)
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		s, err := env.admin.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		svc, last = s, meta.FindStatusCondition(s.Status.Conditions, lb.ConditionAnnounced)
		return last != nil && ok(*last), nil
	})
	if err != nil || last == nil {
		t.Fatalf("Service %s: %s did not happen within %s (condition: %+v)", name, what, timeout, last)
	}
	return *last, svc
}

func answeredBy(node string, mac net.HardwareAddr) func(metav1.Condition) bool {
	return func(c metav1.Condition) bool {
		a, err := lb.ParseAnnounced(c)
		return err == nil && c.Status == metav1.ConditionTrue && c.Reason == lb.ReasonAnnounced &&
			len(a) == 1 && a[0].Node == node && a[0].MAC.String() == mac.String()
	}
}

// Placement you can see: the Service's Announced condition names the node
// that answers ARP for its VIP and since when, follows a failover, says so
// when no node can answer, is not rewritten at steady state, leaves the
// service controller's status.loadBalancer alone, and goes away with the
// load balancer.
func TestAnnouncedConditionAcrossFailover(t *testing.T) {
	requireEnv(t)
	startCCM(t, lbCloudConfig("10.88.0.94-10.88.0.97"), lbControllers)
	servicesGoneAtEnd(t, "cond-")
	macs := lbNodes(t, "e2e-cond", 2)
	client := newLANClient(t, "10.88.0.12/24")

	createLBService(t, "cond-web", nil)
	vip, _ := waitVIP(t, "cond-web", 30*time.Second)
	first := waitNodeARP(t, client, vip, macs, 10*time.Second)
	c1, svc := waitAnnounced(t, "cond-web", "Announced via "+first, 30*time.Second, answeredBy(first, macs[first]))
	want := fmt.Sprintf("%s answered by node %s (%s)", vip, first, macs[first])
	if c1.Message != want {
		t.Errorf("message %q, want %q", c1.Message, want)
	}
	if ing := svc.Status.LoadBalancer.Ingress; len(ing) != 1 || ing[0].IP != vip.String() {
		t.Errorf("status.loadBalancer.ingress = %+v, want the VIP %s", ing, vip)
	}

	// Steady state: Node changes make placement run, and nothing is
	// written to the Service.
	rv := svc.ResourceVersion
	for name := range macs {
		n, err := env.admin.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels["labcloud-e2e-poke"] = "1"
		if _, err := env.admin.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * time.Second) // passes run within ms of a Node change; give them ample time
	s, err := env.admin.CoreV1().Services("default").Get(context.Background(), "cond-web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.ResourceVersion != rv {
		t.Errorf("the Service was written at steady state (resourceVersion %s -> %s): %+v", rv, s.ResourceVersion, s.Status)
	}

	// lastTransitionTime has one-second resolution: let a second pass so
	// the move's time is visibly later.
	time.Sleep(1100 * time.Millisecond)
	if err := domain(t, first).Destroy(); err != nil {
		t.Fatal(err)
	}
	other := otherNode(macs, first)
	c2, svc := waitAnnounced(t, "cond-web", "Announced via "+other, 15*time.Second, answeredBy(other, macs[other]))
	if !c2.LastTransitionTime.After(c1.LastTransitionTime.Time) {
		t.Errorf("lastTransitionTime %v after the move, want later than %v", c2.LastTransitionTime, c1.LastTransitionTime)
	}
	if got := waitNodeARP(t, client, vip, macs, 10*time.Second); got != other {
		t.Errorf("the condition names %s, ARP is answered by %s", other, got)
	}
	if ing := svc.Status.LoadBalancer.Ingress; len(ing) != 1 || ing[0].IP != vip.String() {
		t.Errorf("after the move status.loadBalancer.ingress = %+v, want the VIP %s", ing, vip)
	}
	t.Logf("condition: %s %s %q since %s", c2.Status, c2.Reason, c2.Message, c2.LastTransitionTime.UTC().Format(time.RFC3339))

	// No node left.
	if err := domain(t, other).Destroy(); err != nil {
		t.Fatal(err)
	}
	c3, _ := waitAnnounced(t, "cond-web", "NoEligibleNode", 15*time.Second, func(c metav1.Condition) bool {
		return c.Status == metav1.ConditionFalse && c.Reason == lb.ReasonNoEligibleNode
	})
	if a, err := lb.ParseAnnounced(c3); err != nil || len(a) != 1 || a[0].VIP != vip || a[0].MAC != nil {
		t.Errorf("NoEligibleNode message %q parses as %+v (%v)", c3.Message, a, err)
	}

	// No longer a load balancer: the condition goes with the VIP.
	s, err = env.admin.CoreV1().Services("default").Get(context.Background(), "cond-web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Spec.Type = v1.ServiceTypeClusterIP
	for i := range s.Spec.Ports {
		s.Spec.Ports[i].NodePort = 0
	}
	s.Spec.ExternalTrafficPolicy = ""
	s.Spec.AllocateLoadBalancerNodePorts = nil
	if _, err := env.admin.CoreV1().Services("default").Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		s, err = env.admin.CoreV1().Services("default").Get(ctx, "cond-web", metav1.GetOptions{})
		return err == nil && meta.FindStatusCondition(s.Status.Conditions, lb.ConditionAnnounced) == nil, nil
	})
	if err != nil {
		t.Fatalf("the Announced condition stayed after the Service became ClusterIP: %+v", s.Status)
	}
}
