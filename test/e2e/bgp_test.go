package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/labcloud/labcloud/internal/frr"
)

// The CCM's BGP speaker, end to end: FRR runs as the LAN router in a
// namespace plugged into the e2e bridge, the CCM (as installed, with a
// password file) peers with it from the bridge's address, and every
// Node's pod CIDR (allocated by kube-controller-manager) reaches the
// router's RIB via the Node's address; a deleted Node's leaves it, and a
// CCM restart costs the router no route.

const (
	e2eRouterAddr = "10.88.0.254"
	e2eCCMAddr    = "10.88.0.1"
)

func bgpCloudConfig(passwordFile string) string {
	return libvirtCloudConfig() + fmt.Sprintf(`bgp:
  asn: 64513
  routerID: %s
  communities: ["64512:76"]
  restartTime: 60s
  peers:
    - address: %s
      asn: 64512
      bfd: true
      passwordFile: %s
`, e2eCCMAddr, e2eRouterAddr, passwordFile)
}

func TestBGPAnnouncesPodCIDRs(t *testing.T) {
	const password = "e2e-bgp-secret"
	router := startRouter(t, password)
	pwFile := filepath.Join(t.TempDir(), "bgp-password")
	if err := os.WriteFile(pwFile, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	names := []string{"e2e-bgp-0", "e2e-bgp-1"}
	leases := map[string]string{}
	for _, name := range names {
		_, mac := defineDomain(t, name, true)
		leases[name] = waitLease(t, mac)
	}
	c := startCCM(t, bgpCloudConfig(pwFile), "--controllers=cloud-node,cloud-node-lifecycle")
	podCIDR := map[string]string{}
	for _, name := range names {
		createNode(t, name, v1.ConditionTrue)
	}
	for _, name := range names {
		n := waitNode(t, name, "initialization and a pod CIDR", 60*time.Second, func(n *v1.Node) bool {
			return n != nil && internalIP(n) != "" && n.Spec.PodCIDR != ""
		})
		podCIDR[name] = n.Spec.PodCIDR
	}
	routed := func(names ...string) func(map[netip.Prefix]frr.Route) bool {
		return func(rib map[netip.Prefix]frr.Route) bool {
			for _, name := range names {
				r, ok := rib[netip.MustParsePrefix(podCIDR[name])]
				if !ok || !r.Selected || !slices.Contains(r.NextHops, netip.MustParseAddr(leases[name])) {
					return false
				}
			}
			return true
		}
	}
	start := time.Now()
	waitRIB(t, router, "every pod CIDR via its node", 60*time.Second, routed(names...))
	t.Logf("the router had every pod CIDR %s after the Nodes had theirs", time.Since(start).Round(time.Millisecond))
	if out, err := router.Vtysh(context.Background(), "show bgp ipv4 unicast "+podCIDR[names[0]]+" json"); err != nil || !strings.Contains(out, "64512:76") {
		t.Errorf("the route carries no community 64512:76 (%v): %s", err, out)
	}

	// A deleted Node's pod CIDR is withdrawn; the other stays.
	gone := names[1]
	if err := env.admin.CoreV1().Nodes().Delete(context.Background(), gone, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRIB(t, router, "the deleted Node's pod CIDR withdrawn", 30*time.Second, func(rib map[netip.Prefix]frr.Route) bool {
		_, still := rib[netip.MustParsePrefix(podCIDR[gone])]
		return !still && routed(names[0])(rib)
	})

	// The CCM stops (as systemd stops it) and a new one starts: the
	// router keeps the route throughout.
	c.proc.Stop()
	stopped := time.Now()
	startCCM(t, bgpCloudConfig(pwFile), "--controllers=cloud-node,cloud-node-lifecycle")
	sawDown := false
	for time.Since(stopped) < 30*time.Second {
		rib, err := router.BGPRoutes(context.Background(), "ip")
		if err != nil {
			t.Fatal(err)
		}
		if !routed(names[0])(rib) {
			t.Fatalf("%s after the CCM stopped, the router lacks %s: %v", time.Since(stopped).Round(time.Millisecond), podCIDR[names[0]], rib)
		}
		st, err := router.NeighborState(context.Background(), netip.MustParseAddr(e2eCCMAddr))
		sawDown = sawDown || err == nil && st != "Established"
		if sawDown && err == nil && st == "Established" {
			t.Logf("the new CCM's session was up %s after the old one stopped; no route lost", time.Since(stopped).Round(time.Millisecond))
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("the new CCM had no session with the router 30 s after the old one stopped (old session seen down: %v)", sawDown)
}

func waitRIB(t testing.TB, r *frr.Router, what string, timeout time.Duration, ok func(map[netip.Prefix]frr.Route) bool) {
	t.Helper()
	last, err := r.WaitBGPRoutes(context.Background(), "ip", timeout, ok)
	if err != nil {
		t.Fatalf("%s: not within %s (%v); the router's BGP routes: %v", what, timeout, err, last)
	}
}

// TestBGPAnnouncesVIPsInRoutedMode: with bgp.announceVIPs the router
// learns each VIP as a host route via the node that answers it, and
// follows the VIP when that node's domain dies.
func TestBGPAnnouncesVIPsInRoutedMode(t *testing.T) {
	router := startRouter(t, "")
	cfg := lbCloudConfig("10.88.0.87-10.88.0.88") + fmt.Sprintf(`bgp:
  asn: 64513
  routerID: %s
  announceVIPs: true
  peers: [{address: %s, asn: 64512, bfd: true}]
`, e2eCCMAddr, e2eRouterAddr)
	macs := map[string]net.HardwareAddr{}
	nodeIP := map[string]netip.Addr{}
	names := []string{"e2e-routed-1", "e2e-routed-2"}
	for _, name := range names {
		_, mac := defineDomain(t, name, true)
		macs[name], _ = net.ParseMAC(mac)
		nodeIP[name] = netip.MustParseAddr(waitLease(t, mac))
	}
	startCCM(t, cfg, lbControllers)
	servicesGoneAtEnd(t, "routed-")
	for _, name := range names {
		createNode(t, name, v1.ConditionTrue)
	}
	for _, name := range names {
		waitNode(t, name, "initialization with its address", 60*time.Second, func(n *v1.Node) bool { return n != nil && internalIP(n) != "" })
	}
	heartbeat(t, names...)
	createLBService(t, "routed-web", nil)
	vip, _ := waitVIP(t, "routed-web", 30*time.Second)
	host := netip.PrefixFrom(vip, 32)
	via := func(node string) func(map[netip.Prefix]frr.Route) bool {
		return func(rib map[netip.Prefix]frr.Route) bool {
			r, ok := rib[host]
			return ok && r.Selected && slices.Equal(r.NextHops, []netip.Addr{nodeIP[node]})
		}
	}
	var first string
	waitRIB(t, router, "the VIP via the node answering it", 60*time.Second, func(rib map[netip.Prefix]frr.Route) bool {
		for node := range macs {
			if via(node)(rib) {
				first = node
				return true
			}
		}
		return false
	})
	if err := domain(t, first).Destroy(); err != nil {
		t.Fatal(err)
	}
	destroyed := time.Now()
	other := otherNode(macs, first)
	waitRIB(t, router, "the VIP via "+other+" after "+first+"'s domain died", 30*time.Second, via(other))
	t.Logf("the router routed %s via %s, then via %s %s after %s's domain was destroyed", host, first, other, time.Since(destroyed).Round(time.Millisecond), first)
}

// startRouter starts FRR as the LAN router at e2eRouterAddr, peering with
// the CCM at e2eCCMAddr (with password, if not empty).
func startRouter(t *testing.T, password string) *frr.Router {
	t.Helper()
	requireEnv(t)
	if err := frr.Available(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	client := newLANClient(t, e2eRouterAddr+"/24")
	routerDir, err := os.MkdirTemp("", "lce2e-frr-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(routerDir) })
	router, err := frr.Start(context.Background(), client.Netns(), routerDir, frr.Config{
		ASN: 64512, RouterID: netip.MustParseAddr(e2eRouterAddr),
		Neighbors: []frr.Neighbor{{Address: netip.MustParseAddr(e2eCCMAddr), ASN: 64513, BFD: true, Password: password}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(router.LogTail(20))
		}
		router.Stop()
	})
	return router
}
