package provider

import (
	"context"
	"errors"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
)

// With no load balancer configured (the installed config), LoadBalancer
// Services are served by loadBalancerOff: each gets a Warning that names
// the fields to set, none gets an address, and deletion never sticks.
func TestLoadBalancerOffWarnsAndNamesTheFields(t *testing.T) {
	cfg, err := LoadConfig(strings.NewReader("hypervisors: [{uri: 'test:///default'}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	c := New(cfg, nil)
	impl, ok := c.LoadBalancer()
	if !ok || impl != c.lbOff {
		t.Fatalf("LoadBalancer() = %v, %v; want the warning implementation", impl, ok)
	}
	rec := record.NewFakeRecorder(10)
	if err := c.lbOff.start(context.Background(), nil, nil, rec); err != nil {
		t.Fatal(err)
	}
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}, Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer}}
	st, err := impl.EnsureLoadBalancer(context.Background(), "", svc, nil)
	if st != nil || !errors.Is(err, errLoadBalancerOff) {
		t.Fatalf("EnsureLoadBalancer = %v, %v; want no status and errLoadBalancerOff", st, err)
	}
	for _, want := range []string{"ns/web", "loadBalancer.bridge", "loadBalancer.pools"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if ev := <-rec.Events; !strings.HasPrefix(ev, "Warning "+ReasonNotConfigured+" ") || !strings.Contains(ev, "loadBalancer.pools") {
		t.Errorf("event %q, want a Warning %s naming loadBalancer.pools", ev, ReasonNotConfigured)
	}
	if err := impl.UpdateLoadBalancer(context.Background(), "", svc, nil); !errors.Is(err, errLoadBalancerOff) {
		t.Errorf("UpdateLoadBalancer = %v", err)
	}
	if _, exists, err := impl.GetLoadBalancer(context.Background(), "", svc); exists || err != nil {
		t.Errorf("GetLoadBalancer = %v, %v; want none", exists, err)
	}
	if err := impl.EnsureLoadBalancerDeleted(context.Background(), "", svc); err != nil {
		t.Errorf("EnsureLoadBalancerDeleted = %v; deletion must never stick", err)
	}
}
