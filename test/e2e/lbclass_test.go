package e2e

import (
	"context"
	"maps"
	"net"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

const ourClass = "lb.labcloud.io/l2"

// TestLoadBalancerClass: with loadBalancer.class set and serveClassless
// false, a Service of the class gets a VIP answered on the bridge, while a
// Service without a class and one of another class are never touched (no
// finalizer, no status) by either the class controller or upstream's.
func TestLoadBalancerClass(t *testing.T) {
	requireEnv(t)
	startCCM(t, lbCloudConfig("10.88.0.40-10.88.0.45")+"  class: "+ourClass+"\n  serveClassless: false\n",
		"--controllers=cloud-node,cloud-node-lifecycle,service,service-lb-class-controller")
	macs := twoNodes(t, "e2e-class")
	client := newLANClient(t, "10.88.0.6/24")

	for name, class := range map[string]*string{"classed": ptr.To(ourClass), "classless": nil, "other": ptr.To("example.com/other")} {
		createService(t, &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, LoadBalancerClass: class,
				Ports: []v1.ServicePort{{Name: "p80", Port: 80, Protocol: v1.ProtocolTCP}}},
		})
	}
	vip, svc := waitVIP(t, "classed", 30*time.Second)
	if svc.Spec.LoadBalancerClass == nil || len(svc.Finalizers) != 1 {
		t.Errorf("classed Service: class %v, finalizers %v", svc.Spec.LoadBalancerClass, svc.Finalizers)
	}
	mac, err := client.Resolve(vip, time.Second)
	if err != nil || mac == nil {
		t.Fatalf("no ARP answer for the classed Service's VIP %s: %v", vip, err)
	}
	if !slices.ContainsFunc(slices.Collect(maps.Values(macs)), func(m net.HardwareAddr) bool { return m.String() == mac.String() }) {
		t.Errorf("ARP for %s answered with %s, no node's MAC", vip, mac)
	}
	time.Sleep(3 * time.Second) // the controllers have had their turn
	for _, name := range []string{"classless", "other"} {
		s, err := env.admin.CoreV1().Services("default").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Finalizers) > 0 || len(s.Status.LoadBalancer.Ingress) > 0 {
			t.Errorf("Service %s was touched: finalizers %v, status %v", name, s.Finalizers, s.Status.LoadBalancer)
		}
	}

	// Deleting the classed Service releases its VIP and completes.
	if err := env.admin.CoreV1().Services("default").Delete(context.Background(), "classed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := env.admin.CoreV1().Services("default").Get(ctx, "classed", metav1.GetOptions{})
		return err != nil, nil
	})
	if err != nil {
		t.Fatal("the classed Service's deletion did not complete: its finalizer stayed")
	}
	if m := hostNeighbour(vip); m != nil {
		t.Errorf("the released VIP %s still has a host neighbour entry %s", vip, m)
	}
}
