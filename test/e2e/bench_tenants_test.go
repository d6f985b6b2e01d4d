package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/labcloud/labcloud/lb"
)

// BenchmarkTenantLoad: one namespace makes what it can to slow the others
// (1000 Services asking for one taken address, and 20 Services sharing a
// key with 5,000 ports each) while another namespace's VIP fails over.
// It reports the failover (domain destroyed → gratuitous ARP naming the
// other node) unloaded and loaded, and the CCM's API writes per minute under the
// load, from the API server's audit log. A loaded failover slower than
// twice the unloaded one fails.
func BenchmarkTenantLoad(b *testing.B) {
	requireEnv(b)
	events, closeEvents := lifecycleEvents(b)
	defer closeEvents()
	startCCM(b, lbCloudConfig("10.88.0.31-10.88.0.39"), lbControllers)
	for _, ns := range []string{"bench-noisy", "bench-quiet"} {
		namespaceGoneAtEnd(b, ns)
	}
	macs := lbNodes(b, "bench-tn", 2)
	client := newLANClient(b, "10.88.0.11/24")
	arps := client.capture(b)
	createNamespacedService(b, lbBenchService("bench-quiet", "victim", nil, nil))
	vip := waitNamespacedVIP(b, "bench-quiet", "victim")

	const samples = 3
	// Timed from the destroy: the test's own libvirt event can arrive after
	// the CCM has reacted to its own.
	_, unloaded := failovers(b, events, client, arps, vip, macs, samples, destroy)

	taken := "10.88.0.35"
	createNamespacedService(b, lbBenchService("bench-noisy", "holder", map[string]string{lb.AnnotationIP: taken}, nil))
	waitNamespacedVIP(b, "bench-noisy", "holder")
	const waiting, sharing, ports = 1000, 20, 5000
	var svcs []*v1.Service
	for i := range waiting {
		svcs = append(svcs, lbBenchService("bench-noisy", fmt.Sprintf("waiter-%d", i), map[string]string{lb.AnnotationIP: taken}, nil))
	}
	for h := range sharing {
		proto, first := v1.ProtocolTCP, 1+(h%10)*ports
		if h >= 10 {
			proto = v1.ProtocolUDP
		}
		var ps []v1.ServicePort
		for p := range ports {
			ps = append(ps, v1.ServicePort{Name: fmt.Sprintf("p%d", p), Port: int32(first + p), Protocol: proto})
		}
		svcs = append(svcs, lbBenchService("bench-noisy", fmt.Sprintf("sharer-%d", h), map[string]string{lb.AnnotationSharingKey: "k"}, ps))
	}
	loadStart := time.Now()
	var failed atomic.Int64
	createAll(len(svcs), func(i int) {
		if _, err := env.admin.CoreV1().Services("bench-noisy").Create(context.Background(), svcs[i], metav1.CreateOptions{}); err != nil {
			failed.Add(1)
			b.Logf("create %s: %v", svcs[i].Name, err)
		}
	})
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d of %d Services not created", n, len(svcs))
	}
	b.Logf("load: %d Services created in %s", len(svcs), time.Since(loadStart).Round(time.Second))

	time.Sleep(30 * time.Second) // the waiting Services are into their backoff
	_, loaded := failovers(b, events, client, arps, vip, macs, samples, destroy)
	window := time.Minute
	t0 := time.Now()
	time.Sleep(window)
	writes := auditWrites(b, t0, t0.Add(window))
	perMinute := float64(len(writes)) / window.Minutes()

	p50 := func(xs []time.Duration) time.Duration { s := slices.Clone(xs); slices.Sort(s); return s[len(s)/2] }
	b.ReportMetric(ms(p50(unloaded)), "unloaded-failover-p50-ms")
	b.ReportMetric(ms(p50(loaded)), "loaded-failover-p50-ms")
	b.ReportMetric(perMinute, "api-writes/min")
	b.Logf("failover destroy → gratuitous ARP: unloaded %v, loaded %v; %0.f CCM writes/min under load: %s", unloaded, loaded, perMinute, summarize(writes))
	if p50(loaded) > 2*p50(unloaded) {
		b.Errorf("loaded failover p50 %s is over twice the unloaded %s", p50(loaded), p50(unloaded))
	}
}

// lbBenchService is a LoadBalancer Service in ns; with no ports, port 80.
// It asks for no node ports: thousands of ports would fill their range.
func lbBenchService(ns, name string, annotations map[string]string, ports []v1.ServicePort) *v1.Service {
	if ports == nil {
		ports = []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}
	}
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations},
		Spec:       v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, Ports: ports, AllocateLoadBalancerNodePorts: ptr.To(false)},
	}
}

func createNamespacedService(tb testing.TB, svc *v1.Service) {
	tb.Helper()
	if _, err := env.admin.CoreV1().Services(svc.Namespace).Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("create Service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
}

func waitNamespacedVIP(tb testing.TB, ns, name string) netip.Addr {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		s, err := env.admin.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && len(s.Status.LoadBalancer.Ingress) > 0 {
			if ip, err := netip.ParseAddr(s.Status.LoadBalancer.Ingress[0].IP); err == nil {
				return ip
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	tb.Fatalf("Service %s/%s got no VIP within 30s", ns, name)
	return netip.Addr{}
}

// namespaceGoneAtEnd creates ns and deletes it (with its Services, whose
// finalizers the CCM still running removes) at the end.
func namespaceGoneAtEnd(tb testing.TB, ns string) {
	tb.Helper()
	_, err := env.admin.CoreV1().Namespaces().Create(context.Background(), &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx := context.Background()
		if list, err := env.admin.CoreV1().Services(ns).List(ctx, metav1.ListOptions{}); err == nil {
			createAll(len(list.Items), func(i int) {
				_ = env.admin.CoreV1().Services(ns).Delete(ctx, list.Items[i].Name, metav1.DeleteOptions{})
			})
		}
		// The finalizers go while the CCM runs; wait for them.
		_ = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			list, err := env.admin.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
			return err == nil && len(list.Items) == 0, nil
		})
		_ = env.admin.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	})
}
