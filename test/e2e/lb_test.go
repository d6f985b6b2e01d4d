package e2e

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const lbControllers = "--controllers=cloud-node,cloud-node-lifecycle,service"

// twoNodes defines two running domains with Ready, initialized Nodes and
// returns their MACs by node name.
func twoNodes(t *testing.T, prefix string) map[string]net.HardwareAddr {
	t.Helper()
	macs := map[string]net.HardwareAddr{}
	for _, n := range []string{prefix + "-1", prefix + "-2"} {
		_, mac := defineDomain(t, n, true)
		macs[n], _ = net.ParseMAC(mac)
		createNode(t, n, v1.ConditionTrue)
	}
	for n := range macs {
		waitNode(t, n, "initialization", 30*time.Second, func(n *v1.Node) bool { return n != nil && n.Spec.ProviderID != "" })
	}
	return macs
}

func hostNeighbour(ip netip.Addr) net.HardwareAddr {
	link, err := netlink.LinkByName(env.bridge)
	if err != nil {
		return nil
	}
	family := netlink.FAMILY_V4
	if ip.Is6() {
		family = netlink.FAMILY_V6
	}
	neighs, _ := netlink.NeighList(link.Attrs().Index, family)
	for _, n := range neighs {
		if n.IP.Equal(ip.AsSlice()) && n.State&netlink.NUD_PERMANENT != 0 {
			return n.HardwareAddr
		}
	}
	return nil
}

func TestLoadBalancerVIPAnnouncedAndReleased(t *testing.T) {
	requireEnv(t)
	startCCM(t, lbCloudConfig("10.88.0.20-10.88.0.30"), lbControllers)
	macs := twoNodes(t, "e2e-lb")
	client := newLANClient(t, "10.88.0.5/24")

	createLBService(t, "web", nil)
	vip, svc := waitVIP(t, "web", 30*time.Second)
	if !netip.MustParsePrefix("10.88.0.16/28").Contains(vip) || vip.Compare(netip.MustParseAddr("10.88.0.20")) < 0 {
		t.Fatalf("VIP %s not from the pool 10.88.0.20-30", vip)
	}
	ing := svc.Status.LoadBalancer.Ingress[0]
	if ing.IPMode == nil || *ing.IPMode != v1.LoadBalancerIPModeVIP {
		t.Errorf("ingress ipMode = %v, want VIP", ing.IPMode)
	}
	if !slices.Contains(svc.Finalizers, "service.kubernetes.io/load-balancer-cleanup") {
		t.Errorf("finalizers = %v, want the load-balancer cleanup finalizer", svc.Finalizers)
	}

	mac, err := client.Resolve(vip, time.Second)
	if err != nil || mac == nil {
		t.Fatalf("no ARP answer for %s: %v", vip, err)
	}
	answering := ""
	for n, m := range macs {
		if m.String() == mac.String() {
			answering = n
		}
	}
	if answering == "" {
		t.Fatalf("ARP for %s answered with %s, which is no node's MAC (%v)", vip, mac, macs)
	}
	if got := hostNeighbour(vip); got.String() != mac.String() {
		t.Errorf("host neighbour entry for %s = %v, want %s", vip, got, mac)
	}
	// Only owned VIPs are answered.
	if other, err := client.Resolve(netip.MustParseAddr("10.88.0.29"), 500*time.Millisecond); err != nil || other != nil {
		t.Errorf("ARP for an unassigned pool address answered with %v (%v)", other, err)
	}

	// Failover: the answering node's domain stops; the VIP moves at once.
	start := time.Now()
	if err := domain(t, answering).Destroy(); err != nil {
		t.Fatal(err)
	}
	other := otherNode(macs, answering)
	client.waitARP(t, vip, macs[other], 10*time.Second)
	t.Logf("VIP %s moved from %s to %s in %s (domain destroy -> LAN ARP answer)", vip, answering, other, time.Since(start).Round(time.Millisecond))

	// Delete: IP released, finalizer gone, ARP answers stop.
	if err := env.admin.CoreV1().Services("default").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := env.admin.CoreV1().Services("default").Get(context.Background(), "web", metav1.GetOptions{})
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("service with the cleanup finalizer was not removed within 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	client.waitARP(t, vip, nil, 10*time.Second)
	if got := hostNeighbour(vip); got != nil {
		t.Errorf("host neighbour entry for %s left behind: %s", vip, got)
	}
}

// TestLBFailoverOnQEMUKilled: the answering domain's QEMU is killed. The
// kernel deletes its tap at once; the CCM sees the tap leave the bridge and
// moves the VIP to the other node without waiting for libvirt's stopped
// event (the log names the tap, and the LAN hears the other node's MAC).
func TestLBFailoverOnQEMUKilled(t *testing.T) {
	r := newFailoverRig(t, "lbq")
	answering := waitNodeARP(t, r.client, r.vip, r.macs, 15*time.Second)
	fromEvent, fromKill := r.failovers(t, 1, killQEMU)
	t.Logf("QEMU of %s killed: the other node's gratuitous ARP %s after the kill, %s after libvirt's stopped event", answering, fromKill[0], fromEvent[0])
	if log := r.ccm.proc.Tail(400); !strings.Contains(log, "A domain's tap left the bridge") || !strings.Contains(log, `domain="`+answering+`"`) {
		t.Errorf("the CCM's log never says %s's tap left the bridge; tail:\n%s", answering, r.ccm.proc.Tail(30))
	}
}
