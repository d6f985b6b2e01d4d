package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/labcloud/labcloud/netroutes"
	"github.com/labcloud/labcloud/provider/placement"
)

// hostPaths is the next hops of the host's proto-77 route to vip, sorted
// ("" when there is none).
func hostPaths(vip netip.Addr) string {
	dst := &net.IPNet{IP: vip.AsSlice(), Mask: net.CIDRMask(32, 32)}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: dst, Protocol: netroutes.VIPProtocol},
		netlink.RT_FILTER_DST|netlink.RT_FILTER_PROTOCOL)
	if err != nil || len(routes) == 0 {
		return ""
	}
	var hops []string
	if r := routes[0]; len(r.MultiPath) == 0 {
		hops = append(hops, r.Gw.String())
	} else {
		for _, nh := range r.MultiPath {
			hops = append(hops, nh.Gw.String())
		}
	}
	slices.Sort(hops)
	return strings.Join(hops, " ")
}

func waitHostPaths(t *testing.T, vip netip.Addr, want []string, why string) {
	t.Helper()
	waitHostPathsFor(t, vip, want, why, 15*time.Second)
}

func waitHostPathsFor(t *testing.T, vip netip.Addr, want []string, why string, timeout time.Duration) {
	t.Helper()
	slices.Sort(want)
	w := strings.Join(want, " ")
	var got string
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		got = hostPaths(vip)
		return got == w, nil
	})
	if err != nil {
		t.Fatalf("%s: host route to %s via [%s], want [%s]", why, vip, got, w)
	}
}

// TestLoadBalancerSpreadRoutes: the host's route to a VIP has every node
// that may answer it as a next hop, narrows to the answering node for
// ClientIP affinity, drops a node whose domain dies, and goes with the
// Service.
func TestLoadBalancerSpreadRoutes(t *testing.T) {
	requireEnv(t)
	names := []string{"e2e-spread-1", "e2e-spread-2", "e2e-spread-3"}
	ips, macs := map[string]string{}, map[string]net.HardwareAddr{}
	for _, name := range names {
		_, mac := defineDomain(t, name, true)
		macs[name], _ = net.ParseMAC(mac)
		ips[name] = waitLease(t, mac)
	}
	startCCM(t, lbCloudConfig("10.88.0.85-10.88.0.86"), lbControllers)
	servicesGoneAtEnd(t, "spread-")
	for _, name := range names {
		createNode(t, name, v1.ConditionTrue)
	}
	for _, name := range names {
		waitNode(t, name, "an InternalIP", 60*time.Second, func(n *v1.Node) bool {
			return n != nil && slices.ContainsFunc(n.Status.Addresses, func(a v1.NodeAddress) bool {
				return a.Type == v1.NodeInternalIP && a.Address == ips[name]
			})
		})
	}
	heartbeat(t, names...)

	createLBService(t, "spread-1", nil)
	vip, _ := waitVIP(t, "spread-1", 30*time.Second)
	all := []string{ips[names[0]], ips[names[1]], ips[names[2]]}
	waitHostPaths(t, vip, all, "three eligible nodes")

	setAffinity := func(a v1.ServiceAffinity) {
		t.Helper()
		s, err := env.admin.CoreV1().Services("default").Get(context.Background(), "spread-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Spec.SessionAffinity = a
		if _, err := env.admin.CoreV1().Services("default").Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	answering := func() string {
		mac := hostNeighbour(vip)
		for n, m := range macs {
			if m.String() == mac.String() {
				return n
			}
		}
		t.Fatalf("host neighbour entry for %s is %v, no node's MAC", vip, mac)
		return ""
	}
	setAffinity(v1.ServiceAffinityClientIP)
	waitHostPaths(t, vip, []string{ips[answering()]}, "ClientIP affinity")
	setAffinity(v1.ServiceAffinityNone)
	waitHostPaths(t, vip, all, "affinity off again")

	// A route someone else deletes (`ip route flush proto 77`, a network
	// daemon) is put back by the next pass that reads the kernel's routes:
	// the resync's at the latest, as nothing else changes here.
	gone := &netlink.Route{Dst: &net.IPNet{IP: vip.AsSlice(), Mask: net.CIDRMask(32, 32)}, Protocol: netroutes.VIPProtocol, Priority: netroutes.DefaultMetric}
	if err := netlink.RouteDel(gone); err != nil {
		t.Fatalf("deleting the route to %s: %v", vip, err)
	}
	waitHostPathsFor(t, vip, all, "route deleted by someone else", placement.Resync+10*time.Second)

	// A dead domain leaves the route with the ARP answer's move.
	dead := answering()
	if err := domain(t, dead).Destroy(); err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, n := range names {
		if n != dead {
			left = append(left, ips[n])
		}
	}
	waitHostPaths(t, vip, left, fmt.Sprintf("domain of %s destroyed", dead))
	if a := answering(); a == dead {
		t.Errorf("ARP still answered by %s, whose domain is destroyed", dead)
	}

	if err := env.admin.CoreV1().Services("default").Delete(context.Background(), "spread-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitHostPaths(t, vip, nil, "Service deleted")
}
