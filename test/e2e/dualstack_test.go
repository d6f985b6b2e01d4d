package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/labcloud/labcloud/lab/lanprobe"
)

// A RequireDualStack Service gets one VIP per family; a LAN client's kernel
// resolves both, over ARP and NDP, to one node; when that node's domain is
// destroyed both move to one other node, announced to the client without
// its asking. A host on the LAN that takes the IPv6 VIP finds it taken,
// and the Service says so.
func TestLoadBalancerDualStack(t *testing.T) {
	requireEnv(t)
	startCCM(t, lbCloudConfig("10.88.0.77-10.88.0.78, fd88::77-fd88::78"), lbControllers)
	servicesGoneAtEnd(t, "ds-")
	macs := lbNodes(t, "e2e-lbds", 3)
	client := newLANClient(t, "10.88.0.8/24")
	client.addIPv6(t, "fd88::8/64")

	createService(t, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "ds-1"},
		Spec: v1.ServiceSpec{
			Type:           v1.ServiceTypeLoadBalancer,
			IPFamilyPolicy: ptr.To(v1.IPFamilyPolicyRequireDualStack),
			IPFamilies:     []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol},
			Ports:          []v1.ServicePort{{Port: 80}},
		},
	})
	vips := waitVIPs(t, "ds-1", 2, 30*time.Second)
	v4, v6 := vips[0], vips[1]
	if !v4.Is4() || !v6.Is6() {
		t.Fatalf("ingress %v, want an IPv4 VIP then an IPv6 one", vips)
	}

	first4 := client.neighbourVia(t, v4, 10*time.Second)
	first6 := client.neighbourVia(t, v6, 10*time.Second)
	if first4.String() != first6.String() {
		t.Fatalf("%s resolves to %s but %s to %s: one node must answer both", v4, first4, v6, first6)
	}
	first := nodeOf(macs, first4)
	if first == "" {
		t.Fatalf("the VIPs resolve to %s, no node's MAC", first4)
	}
	if got := hostNeighbour(v6); got.String() != first6.String() {
		t.Errorf("host neighbour entry for %s: %v, want %s", v6, got, first6)
	}

	since := time.Now()
	if err := domain(t, first).Destroy(); err != nil {
		t.Fatal(err)
	}
	var to4, to6 net.HardwareAddr
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
		to4, to6 = client.neighbour(t, v4), client.neighbour(t, v6)
		return to4 != nil && to6 != nil && to4.String() != first4.String() && to4.String() == to6.String(), nil
	})
	took := time.Since(since)
	if err != nil {
		t.Fatalf("after %s's domain was destroyed the client holds %s for %s and %s for %s, want one other node's MAC for both", first, to4, v4, to6, v6)
	}
	t.Logf("domain destroyed → both VIPs moved to %s in the client's neighbour table, without asking: %v", nodeOf(macs, to4), took.Round(time.Millisecond))

	// A LAN host configures the IPv6 VIP: its duplicate-address detection
	// fails, and the Service gets a Warning naming the host.
	client.run(t, "ip", "addr", "add", v6.String()+"/64", "dev", lanprobe.Interface)
	err = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return strings.Contains(client.run(t, "ip", "-6", "addr", "show", "dev", lanprobe.Interface), "dadfailed"), nil
	})
	if err != nil {
		t.Fatalf("the client's duplicate-address detection for %s did not fail:\n%s", v6, client.run(t, "ip", "-6", "addr", "show", "dev", lanprobe.Interface))
	}
	clientMAC := client.mac(t).String()
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := env.admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=ds-1,reason=IPConflict"})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, clientMAC) && strings.Contains(e.Message, v6.String()) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no IPConflict event on ds-1 naming %s and %s", clientMAC, v6)
	}
}

// waitVIPs waits for the Service's first n ingress IPs.
func waitVIPs(t testing.TB, name string, n int, timeout time.Duration) []netip.Addr {
	t.Helper()
	var ips []netip.Addr
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		s, err := env.admin.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ips = ips[:0]
		for _, in := range s.Status.LoadBalancer.Ingress {
			ips = append(ips, netip.MustParseAddr(in.IP))
		}
		return len(ips) >= n, nil
	})
	if err != nil {
		t.Fatalf("service %s got %v, not %d VIPs, within %s", name, ips, n, timeout)
	}
	return ips
}

func nodeOf(macs map[string]net.HardwareAddr, mac net.HardwareAddr) string {
	for n, m := range macs {
		if m.String() == mac.String() {
			return n
		}
	}
	return ""
}

func (c *lanClient) run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", c.Netns()}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v in %s: %v: %s", args, c.Netns(), err, out)
	}
	return string(out)
}

func (c *lanClient) addIPv6(t testing.TB, addr string) {
	t.Helper()
	c.run(t, "ip", "addr", "add", addr, "dev", lanprobe.Interface, "nodad")
}

// neighbour is the MAC the client's kernel holds for ip, or nil.
func (c *lanClient) neighbour(t testing.TB, ip netip.Addr) net.HardwareAddr {
	t.Helper()
	mac, err := c.Neighbour(ip)
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

// neighbourVia has the client's kernel resolve ip (it sends a datagram
// there) and returns the MAC it resolved to.
func (c *lanClient) neighbourVia(t testing.TB, ip netip.Addr, timeout time.Duration) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		err := c.Do(func() error {
			conn, err := net.Dial("udp", net.JoinHostPort(ip.String(), "9"))
			if err != nil {
				return err
			}
			defer conn.Close()
			_, err = conn.Write([]byte("who"))
			return err
		})
		if err != nil {
			return false, fmt.Errorf("sending to %s: %w", ip, err)
		}
		time.Sleep(50 * time.Millisecond)
		mac = c.neighbour(t, ip)
		return mac != nil, nil
	})
	if err != nil {
		t.Fatalf("the client's kernel did not resolve %s: %v", ip, err)
	}
	return mac
}
