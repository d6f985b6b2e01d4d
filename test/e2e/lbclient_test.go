package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/labcloud/labcloud/lab/lanprobe"
)

var clientSeq atomic.Int32

// lanClient is a machine plugged into the e2e bridge (lanprobe), standing
// for another machine on the LAN that asks who has a VIP.
type lanClient struct{ *lanprobe.Client }

func newLANClient(t testing.TB, addr string) *lanClient {
	t.Helper()
	n := clientSeq.Add(1)
	// Named per run: a run that was killed leaves its names behind.
	c, err := lanprobe.New(lanprobe.Options{Bridge: env.bridge, Port: fmt.Sprintf("lcc%dh", n), Addr: netip.MustParsePrefix(addr),
		Netns: fmt.Sprintf("lce2e-%d-client%d", os.Getpid(), n)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &lanClient{c}
}

// waitARP polls until the client's ARP request for ip is answered with
// want (or, with want nil, until nobody answers).
func (c *lanClient) waitARP(t testing.TB, ip netip.Addr, want net.HardwareAddr, timeout time.Duration) {
	t.Helper()
	var last net.HardwareAddr
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		mac, err := c.Resolve(ip, 300*time.Millisecond)
		if err != nil {
			return false, err
		}
		last = mac
		if want == nil {
			return mac == nil, nil
		}
		return mac.String() == want.String(), nil
	})
	if err != nil {
		t.Fatalf("ARP for %s from the LAN: answered by %v, want %v: %v", ip, last, want, err)
	}
}

// mac is the MAC of the client's interface.
func (c *lanClient) mac(t testing.TB) net.HardwareAddr {
	t.Helper()
	mac, err := c.MAC()
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

// capture records what reaches the client until the test ends.
func (c *lanClient) capture(t testing.TB) *lanprobe.Capture {
	t.Helper()
	a, err := c.Capture()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// createLBService creates a LoadBalancer Service with the given annotations.
func createLBService(t testing.TB, name string, annotations map[string]string, ports ...int32) *v1.Service {
	t.Helper()
	if len(ports) == 0 {
		ports = []int32{80}
	}
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: annotations},
		Spec:       v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer},
	}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{Name: fmt.Sprintf("p%d", p), Port: p, Protocol: v1.ProtocolTCP})
	}
	return createService(t, svc)
}

// createService creates svc in "default" and deletes it after the test.
func createService(t testing.TB, svc *v1.Service) *v1.Service {
	t.Helper()
	created, err := env.admin.CoreV1().Services("default").Create(context.Background(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service %s: %v", svc.Name, err)
	}
	t.Cleanup(func() {
		_ = env.admin.CoreV1().Services("default").Delete(context.Background(), svc.Name, metav1.DeleteOptions{})
	})
	return created
}

// waitVIP waits for the Service's first ingress IP.
func waitVIP(t testing.TB, name string, timeout time.Duration) (netip.Addr, *v1.Service) {
	t.Helper()
	var svc *v1.Service
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		s, err := env.admin.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		svc = s
		return len(s.Status.LoadBalancer.Ingress) > 0, nil
	})
	if err != nil {
		t.Fatalf("service %s got no VIP within %s", name, timeout)
	}
	return netip.MustParseAddr(svc.Status.LoadBalancer.Ingress[0].IP), svc
}

// lbCloudConfig is the e2e cloud config with load balancers on the bridge.
func lbCloudConfig(pool string) string {
	return libvirtCloudConfig() + fmt.Sprintf(`loadBalancer:
  bridge: %s
  pools: [{name: e2e, addresses: [%s]}]
`, env.bridge, pool)
}
