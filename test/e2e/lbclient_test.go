package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/vishvananda/netns"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

var clientSeq atomic.Int32

// lanClient is a network namespace plugged into the e2e bridge, standing
// for another machine on the LAN that asks who has a VIP.
type lanClient struct {
	ns   netns.NsHandle
	name string
	ifc  string
}

func newLANClient(t testing.TB, addr string) *lanClient {
	t.Helper()
	n := clientSeq.Add(1)
	name := fmt.Sprintf("lce2e-client%d", n)
	host, peer := fmt.Sprintf("lcc%dh", n), fmt.Sprintf("lcc%dp", n)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	run("ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	run("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", host).Run() })
	run("ip", "link", "set", host, "master", env.bridge, "up")
	run("ip", "link", "set", peer, "netns", name)
	run("ip", "-n", name, "link", "set", "lo", "up")
	run("ip", "-n", name, "addr", "add", addr, "dev", peer)
	run("ip", "-n", name, "link", "set", peer, "up")
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return &lanClient{ns: ns, name: name, ifc: peer}
}

// resolve sends one ARP request for ip from the client and returns the
// answer's MAC, or nil if nobody answered within timeout.
func (c *lanClient) resolve(ip netip.Addr, timeout time.Duration) (net.HardwareAddr, error) {
	type result struct {
		mac net.HardwareAddr
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // the thread is left in the client namespace and dies with the goroutine
		if err := netns.Set(c.ns); err != nil {
			done <- result{err: err}
			return
		}
		ifi, err := net.InterfaceByName(c.ifc)
		if err != nil {
			done <- result{err: err}
			return
		}
		cl, err := arp.Dial(ifi)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer cl.Close()
		_ = cl.SetDeadline(time.Now().Add(timeout))
		mac, err := cl.Resolve(ip)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				err = nil
			}
		}
		done <- result{mac: mac, err: err}
	}()
	r := <-done
	return r.mac, r.err
}

// waitARP polls until the client's ARP request for ip is answered with
// want (or, with want nil, until nobody answers).
func (c *lanClient) waitARP(t testing.TB, ip netip.Addr, want net.HardwareAddr, timeout time.Duration) {
	t.Helper()
	var last net.HardwareAddr
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		mac, err := c.resolve(ip, 300*time.Millisecond)
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
	svc, err := env.admin.CoreV1().Services("default").Create(context.Background(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = env.admin.CoreV1().Services("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return svc
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
