package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Pod-CIDR routes, end to end: kube-controller-manager allocates pod CIDRs
// from 10.244.0.0/16, the CCM's route controller calls the provider, and the
// routes land on the e2e bridge in this test's network namespace (the suite
// already runs inside it).

const routeProto = 76 // netroutes.DefaultProtocol

// routesCloudConfig is the e2e cloud config with routes on the e2e bridge.
func routesCloudConfig(bridge string) string {
	return libvirtCloudConfig() + fmt.Sprintf("routes:\n  bridge: %s\n", bridge)
}

// routeControllerArgs run the route controller next to the node
// controllers only; --configure-cloud-routes and --cluster-cidr come with
// the shipped flags (kube-controller-manager allocates the CIDRs).
var routeControllerArgs = []string{
	"--controllers=cloud-node,cloud-node-lifecycle,route",
}

// ownedRoutes returns the proto-76 routes on the e2e bridge: dst -> gateway.
func ownedRoutes(t testing.TB) map[string]string {
	t.Helper()
	link, err := netlink.LinkByName(env.bridge)
	if err != nil {
		t.Fatalf("bridge %s: %v", env.bridge, err)
	}
	out := map[string]string{}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		var rs []netlink.Route
		for range 5 { // a dump interrupted by a concurrent change is retried
			rs, err = netlink.RouteListFiltered(fam, &netlink.Route{Protocol: routeProto, Table: unix.RT_TABLE_MAIN},
				netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
			if !errors.Is(err, netlink.ErrDumpInterrupted) {
				break
			}
		}
		if err != nil {
			t.Fatalf("list proto %d routes: %v", routeProto, err)
		}
		for _, r := range rs {
			if r.LinkIndex == link.Attrs().Index && r.Dst != nil {
				out[r.Dst.String()] = r.Gw.String()
			}
		}
	}
	return out
}

// waitRoutes polls the bridge's owned routes until cond holds.
func waitRoutes(t testing.TB, what string, timeout time.Duration, cond func(map[string]string) bool) map[string]string {
	t.Helper()
	var last map[string]string
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		last = ownedRoutes(t)
		return cond(last), nil
	})
	if err != nil {
		t.Fatalf("%s did not happen within %s; owned routes on %s: %v", what, timeout, env.bridge, last)
	}
	return last
}

// flushOwnedRoutes removes every proto-76 route, as a reboot or an
// operator's `ip route flush proto 76` would.
func flushOwnedRoutes(t testing.TB) {
	t.Helper()
	for _, fam := range []string{"-4", "-6"} {
		if out, err := exec.Command("ip", fam, "route", "flush", "proto", fmt.Sprint(routeProto)).CombinedOutput(); err != nil {
			t.Errorf("ip %s route flush proto %d: %v: %s", fam, routeProto, err, out)
		}
	}
}

func internalIP(n *v1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == v1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

func networkCondition(n *v1.Node) *v1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == v1.NodeNetworkUnavailable {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func TestRoutesFollowPodCIDRs(t *testing.T) {
	requireEnv(t)
	const nodes = 3
	names := make([]string, nodes)
	leases := map[string]string{}
	macs := map[string]string{}
	for i := range nodes {
		names[i] = fmt.Sprintf("e2e-rt-%d", i)
		_, macs[names[i]] = defineDomain(t, names[i], true)
	}
	for _, name := range names {
		leases[name] = waitLease(t, macs[name])
	}

	// Cleanups run last-in first-out: this one after the CCM has stopped.
	t.Cleanup(func() { flushOwnedRoutes(t) })
	// A foreign route inside the cluster CIDR: never listed, never touched.
	foreign := []string{"route", "add", "10.244.250.0/24", "via", "10.88.0.9", "dev", env.bridge, "proto", "static"}
	if out, err := exec.Command("ip", foreign...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v: %s", foreign, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "route", "del", "10.244.250.0/24", "proto", "static").Run() })

	c := startCCM(t, routesCloudConfig(env.bridge), routeControllerArgs...)
	for _, name := range names {
		createNode(t, name, v1.ConditionTrue)
	}
	// A Node with no InternalIP on the bridge (its domain does not exist):
	// an event, no route, no crash.
	createNode(t, "e2e-rt-ghost", v1.ConditionTrue)

	podCIDR := map[string]string{}
	for _, name := range names {
		n := waitNode(t, name, "initialization and a pod CIDR", 60*time.Second, func(n *v1.Node) bool {
			return n != nil && n.Spec.ProviderID != "" && internalIP(n) != "" && n.Spec.PodCIDR != ""
		})
		if internalIP(n) != leases[name] {
			t.Fatalf("node %s InternalIP %s, want its lease %s", name, internalIP(n), leases[name])
		}
		podCIDR[name] = n.Spec.PodCIDR
	}
	allRouted := func(names ...string) func(map[string]string) bool {
		return func(rs map[string]string) bool {
			for _, name := range names {
				if rs[podCIDR[name]] != leases[name] {
					return false
				}
			}
			return true
		}
	}
	waitRoutes(t, "a route per node", 60*time.Second, allRouted(names...))
	// As iproute2 shows it (unfiltered: a selector drops its own field).
	out, err := exec.Command("ip", "route", "show").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		want := fmt.Sprintf("%s via %s dev %s proto %d metric 3076", podCIDR[name], leases[name], env.bridge, routeProto)
		if !strings.Contains(string(out), want) {
			t.Errorf("ip route show lacks %q:\n%s", want, out)
		}
	}
	for _, name := range names {
		waitNode(t, name, "NetworkUnavailable=False (RouteCreated)", 60*time.Second, func(n *v1.Node) bool {
			cond := networkCondition(n)
			return cond != nil && cond.Status == v1.ConditionFalse && cond.Reason == "RouteCreated"
		})
	}

	ghost := waitNode(t, "e2e-rt-ghost", "NetworkUnavailable=True (NoRouteCreated)", 60*time.Second, func(n *v1.Node) bool {
		cond := networkCondition(n)
		return n != nil && n.Spec.PodCIDR != "" && cond != nil && cond.Status == v1.ConditionTrue && cond.Reason == "NoRouteCreated"
	})
	if gw, ok := ownedRoutes(t)[ghost.Spec.PodCIDR]; ok {
		t.Errorf("a route for the node without an address: %s via %s", ghost.Spec.PodCIDR, gw)
	}
	waitRouteEvent(t, "e2e-rt-ghost", "RouteNotCreated", `no IPv4 address on the bridge subnet(s) [10.88.0.0/24]`)

	// Deleting a Node removes its route, and only its route.
	gone := names[nodes-1]
	if err := env.admin.CoreV1().Nodes().Delete(context.Background(), gone, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRoutes(t, "the deleted node's route removed", 60*time.Second, func(rs map[string]string) bool {
		_, still := rs[podCIDR[gone]]
		return !still && allRouted(names[:nodes-1]...)(rs)
	})

	// After a flush, the routes come back from the Nodes' pod CIDRs.
	flushOwnedRoutes(t)
	if rs := ownedRoutes(t); len(rs) != 0 {
		t.Fatalf("owned routes after a flush: %v", rs)
	}
	waitRoutes(t, "routes rebuilt after `ip route flush proto 76`", 60*time.Second, allRouted(names[:nodes-1]...))

	out, err = exec.Command("ip", "route", "show", "10.244.250.0/24").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "via 10.88.0.9 dev "+env.bridge+" proto static") {
		t.Errorf("the foreign route was touched: %s %v", out, err)
	}
	if c.proc.Exited() {
		t.Fatalf("the CCM exited:\n%s", c.proc.Tail(30))
	}
}

// waitRouteEvent waits for an event with reason on the Node whose message
// contains msg.
func waitRouteEvent(t testing.TB, node, reason, msg string) {
	t.Helper()
	var seen []string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := env.admin.CoreV1().Events("").List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.kind": "Node", "involvedObject.name": node}.String()})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, e := range evs.Items {
			seen = append(seen, e.Type+" "+e.Reason+": "+e.Message)
			if e.Type == v1.EventTypeWarning && e.Reason == reason && strings.Contains(e.Message, msg) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no Warning %s event on node %s containing %q: %v; events: %q", reason, node, msg, err, seen)
	}
}

func TestRoutesMissingBridgeExits(t *testing.T) {
	requireEnv(t)
	const bridge = "lcnosuchbr0"
	if _, err := net.InterfaceByName(bridge); err == nil {
		t.Fatalf("%s exists", bridge)
	}
	c := startCCM(t, routesCloudConfig(bridge), routeControllerArgs...)
	exited := make(chan int, 1)
	go func() { exited <- c.proc.Wait() }()
	select {
	case code := <-exited:
		if code == 0 {
			t.Fatalf("the CCM exited 0 with a missing bridge:\n%s", c.proc.Tail(20))
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the CCM is still running with a missing bridge:\n%s", c.proc.Tail(20))
	}
	tail := strings.ReplaceAll(c.proc.Tail(20), `\"`, `"`)
	if want := fmt.Sprintf(`routes.bridge: bridge %q`, bridge); !strings.Contains(tail, want) {
		t.Fatalf("the CCM's last words do not name the bridge (%s):\n%s", want, tail)
	}
}
