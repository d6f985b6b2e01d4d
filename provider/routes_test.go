package provider

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	cloudprovider "k8s.io/cloud-provider"

	"github.com/labcloud/labcloud/netroutes"
)

// --- the decisions, as tables ---

func rtNode(name string, cidrs []string, internal ...string) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)}}
	n.Spec.PodCIDRs = cidrs
	if len(cidrs) > 0 {
		n.Spec.PodCIDR = cidrs[0]
	}
	for _, a := range internal {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: a})
	}
	return n
}

func rtAddrs(kv ...string) []v1.NodeAddress {
	var out []v1.NodeAddress
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, v1.NodeAddress{Type: v1.NodeAddressType(kv[i]), Address: kv[i+1]})
	}
	return out
}

func rtRoute(dst, gw string) netroutes.Route {
	return netroutes.Route{Dst: netip.MustParsePrefix(dst), Gateway: netip.MustParseAddr(gw)}
}

var rtSubnets = []netip.Prefix{netip.MustParsePrefix("10.88.0.0/24"), netip.MustParsePrefix("fd00:88::/64")}

func TestPlanRoute(t *testing.T) {
	// Wide enough that only the next-hop rules decide (podcidr_test.go has the rest).
	rules := podCIDRRules{cluster: prefixes("10.0.0.0/8", "fd00::/8")}
	for _, tc := range []struct {
		name    string
		subnets []netip.Prefix
		route   cloudprovider.Route
		cached  *v1.Node
		want    string // "<dst> via <gw>", or "" when a problem is expected
		problem string // substring of the problem
	}{
		{name: "InternalIP on the bridge", route: cloudprovider.Route{TargetNode: "a", DestinationCIDR: "10.244.1.0/24",
			TargetNodeAddresses: rtAddrs("Hostname", "a", "InternalIP", "10.88.0.11")}, want: "10.244.1.0/24 via 10.88.0.11"},
		{name: "first InternalIP on the subnet wins", route: cloudprovider.Route{TargetNode: "a", DestinationCIDR: "10.244.1.0/24",
			TargetNodeAddresses: rtAddrs("InternalIP", "192.168.1.5", "InternalIP", "10.88.0.12", "InternalIP", "10.88.0.13")}, want: "10.244.1.0/24 via 10.88.0.12"},
		{name: "ExternalIP on the bridge is not a next hop", route: cloudprovider.Route{TargetNode: "a", DestinationCIDR: "10.244.1.0/24",
			TargetNodeAddresses: rtAddrs("ExternalIP", "10.88.0.11")}, problem: `node "a" pod CIDR 10.244.1.0/24: no IPv4 address on the bridge subnet(s) [10.88.0.0/24]`},
		{name: "falls back to the cached Node", route: cloudprovider.Route{TargetNode: "a", DestinationCIDR: "10.244.1.0/24"},
			cached: rtNode("a", nil, "10.88.0.21"), want: "10.244.1.0/24 via 10.88.0.21"},
		{name: "route's addresses before the cache", route: cloudprovider.Route{TargetNode: "a", DestinationCIDR: "10.244.1.0/24",
			TargetNodeAddresses: rtAddrs("InternalIP", "10.88.0.22")}, cached: rtNode("a", nil, "10.88.0.21"), want: "10.244.1.0/24 via 10.88.0.22"},
		{name: "cache fills in when the route's addresses are off the bridge", route: cloudprovider.Route{TargetNode: "a", DestinationCIDR: "10.244.1.0/24",
			TargetNodeAddresses: rtAddrs("InternalIP", "172.16.0.2")}, cached: rtNode("a", nil, "10.88.0.21"), want: "10.244.1.0/24 via 10.88.0.21"},
		{name: "no address at all", route: cloudprovider.Route{TargetNode: "lonely", DestinationCIDR: "10.244.9.0/24"},
			problem: `node "lonely" pod CIDR 10.244.9.0/24: no IPv4 address`},
		{name: "IPv6 pod CIDR via the IPv6 InternalIP", route: cloudprovider.Route{TargetNode: "a", DestinationCIDR: "fd10:244:1::/64",
			TargetNodeAddresses: rtAddrs("InternalIP", "10.88.0.11", "InternalIP", "fd00:88::11")}, want: "fd10:244:1::/64 via fd00:88::11"},
		{name: "IPv6 pod CIDR on an IPv4-only bridge", subnets: rtSubnets[:1], route: cloudprovider.Route{TargetNode: "a", DestinationCIDR: "fd10:244:1::/64",
			TargetNodeAddresses: rtAddrs("InternalIP", "fd00:88::11")}, problem: "no IPv6 address on the bridge subnet(s) []"},
		{name: "the bridge's network address is not a node", route: cloudprovider.Route{TargetNode: "a", DestinationCIDR: "10.244.1.0/24",
			TargetNodeAddresses: rtAddrs("InternalIP", "10.88.0.0")}, problem: "no IPv4 address"},
		{name: "pod CIDR inside the bridge subnet", route: cloudprovider.Route{TargetNode: "a", DestinationCIDR: "10.88.0.128/25",
			TargetNodeAddresses: rtAddrs("InternalIP", "10.88.0.11")}, problem: "overlaps the bridge subnet 10.88.0.0/24"},
		{name: "unparseable pod CIDR", route: cloudprovider.Route{TargetNode: "a", DestinationCIDR: "10.244.1/24",
			TargetNodeAddresses: rtAddrs("InternalIP", "10.88.0.11")}, problem: `node "a": pod CIDR "10.244.1/24"`},
		{name: "host bits are masked", route: cloudprovider.Route{TargetNode: "a", DestinationCIDR: "10.244.1.7/24",
			TargetNodeAddresses: rtAddrs("InternalIP", "10.88.0.11")}, want: "10.244.1.0/24 via 10.88.0.11"},
		{name: "refused before any next hop is looked for", route: cloudprovider.Route{TargetNode: "a", DestinationCIDR: "128.0.0.0/1",
			TargetNodeAddresses: rtAddrs("InternalIP", "10.88.0.11")}, problem: `node "a" pod CIDR 128.0.0.0/1: overlaps 169.254.0.0/16 (link-local)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			subnets := tc.subnets
			if subnets == nil {
				subnets = rtSubnets
			}
			var nodes []*v1.Node
			if tc.cached != nil {
				nodes = []*v1.Node{tc.cached}
			}
			got, problem := planRoute(routeFacts{subnets: subnets, rules: rules, nodes: nodes}, &tc.route)
			switch {
			case tc.problem != "":
				if problem == nil || !strings.Contains(problem.String(), tc.problem) {
					t.Fatalf("problem = %v, want one containing %q (route %v)", problem, tc.problem, got)
				}
			case problem != nil:
				t.Fatalf("unexpected problem: %v", problem)
			case got.String() != tc.want:
				t.Fatalf("route = %v, want %s", got, tc.want)
			}
		})
	}
}

func TestCloudRoutes(t *testing.T) {
	nodes := []*v1.Node{
		rtNode("b", []string{"10.244.2.0/24", "fd10:244:2::/64"}, "10.88.0.12", "fd00:88::12"),
		rtNode("a", []string{"10.244.1.0/24"}, "10.88.0.11"),
		// c and d share an address (a re-used lease); d claims the route.
		rtNode("c", []string{"10.244.3.0/24"}, "10.88.0.50"),
		rtNode("d", []string{"10.244.4.0/24"}, "10.88.0.50"),
	}
	// An ExternalIP is no route's target.
	nodes[1].Status.Addresses = append(nodes[1].Status.Addresses, v1.NodeAddress{Type: v1.NodeExternalIP, Address: "10.88.0.99"})
	owned := []netroutes.Route{
		rtRoute("10.244.1.0/24", "10.88.0.11"),
		rtRoute("10.244.2.0/24", "10.88.0.12"),
		rtRoute("fd10:244:2::/64", "fd00:88::12"),
		rtRoute("10.244.4.0/24", "10.88.0.50"),
		rtRoute("10.244.5.0/24", "10.88.0.50"), // nobody claims it: first by name
		rtRoute("10.244.7.0/24", "10.88.0.77"), // a deleted node's
		rtRoute("10.244.8.0/24", "10.88.0.99"), // an ExternalIP
		rtRoute("10.244.9.0/24", "10.88.0.11"), // node a, but not its CIDR
	}
	want := []cloudprovider.Route{
		{Name: "10.244.1.0/24 via 10.88.0.11", TargetNode: "a", DestinationCIDR: "10.244.1.0/24"},
		{Name: "10.244.2.0/24 via 10.88.0.12", TargetNode: "b", DestinationCIDR: "10.244.2.0/24"},
		{Name: "fd10:244:2::/64 via fd00:88::12", TargetNode: "b", DestinationCIDR: "fd10:244:2::/64"},
		{Name: "10.244.4.0/24 via 10.88.0.50", TargetNode: "d", DestinationCIDR: "10.244.4.0/24"},
		{Name: "10.244.5.0/24 via 10.88.0.50", TargetNode: "c", DestinationCIDR: "10.244.5.0/24"},
		{Name: "10.244.7.0/24 via 10.88.0.77", DestinationCIDR: "10.244.7.0/24", Blackhole: true},
		{Name: "10.244.8.0/24 via 10.88.0.99", DestinationCIDR: "10.244.8.0/24", Blackhole: true},
		{Name: "10.244.9.0/24 via 10.88.0.11", TargetNode: "a", DestinationCIDR: "10.244.9.0/24"},
	}
	got, stray := cloudRoutes(owned, nodes, podCIDRRules{cluster: rtCluster, connected: rtSubnets})
	if len(stray) != 0 {
		t.Errorf("stray routes: %v", stray)
	}
	if len(got) != len(want) {
		t.Fatalf("got %d routes, want %d: %v", len(got), len(want), got)
	}
	for i := range want {
		if !reflect.DeepEqual(*got[i], want[i]) {
			t.Errorf("route %d = %+v, want %+v", i, *got[i], want[i])
		}
	}
	if got, _ := cloudRoutes(owned[:1], nil, podCIDRRules{cluster: rtCluster}); len(got) != 1 || !got[0].Blackhole {
		t.Errorf("with no nodes: %+v, want a blackhole", got)
	}
}

func TestRouteToDelete(t *testing.T) {
	for _, tc := range []struct {
		route   cloudprovider.Route
		want    string
		wantErr bool
	}{
		{route: cloudprovider.Route{Name: "10.244.1.0/24 via 10.88.0.11", DestinationCIDR: "10.244.1.0/24"}, want: "10.244.1.0/24 via 10.88.0.11"},
		{route: cloudprovider.Route{Name: "fd10::/64 via fd00:88::1", DestinationCIDR: "fd10::/64"}, want: "fd10::/64 via fd00:88::1"},
		// Not one of ours by name: every owned route to the destination.
		{route: cloudprovider.Route{Name: "uid-1234", DestinationCIDR: "10.244.1.0/24"}, want: "10.244.1.0/24 via invalid IP"},
		{route: cloudprovider.Route{DestinationCIDR: "10.244.1.5/24"}, want: "10.244.1.0/24 via invalid IP"},
		{route: cloudprovider.Route{Name: "x", DestinationCIDR: "nope"}, wantErr: true},
	} {
		got, err := routeToDelete(&tc.route)
		if (err != nil) != tc.wantErr {
			t.Errorf("%+v: err = %v, want error %v", tc.route, err, tc.wantErr)
			continue
		}
		if err == nil && got.String() != tc.want {
			t.Errorf("%+v: %v, want %s", tc.route, got, tc.want)
		}
	}
	// ListRoutes' names round-trip.
	for _, r := range []netroutes.Route{rtRoute("10.244.1.0/24", "10.88.0.11"), rtRoute("fd10:244:2::/64", "fd00:88::12")} {
		if back, ok := parseRouteName(routeName(r)); !ok || back != r {
			t.Errorf("parseRouteName(routeName(%v)) = %v, %v", r, back, ok)
		}
	}
}

// --- the provider over fakes of its small pieces ---

// fakeTable is an in-memory routeTable that counts writes.
type fakeTable struct {
	mu        sync.Mutex
	subnets   []netip.Prefix
	connected []netip.Prefix
	routes    map[netip.Prefix]netip.Addr
	writes    int
	err       error // returned by every call when set
}

func newFakeTable() *fakeTable {
	return &fakeTable{subnets: rtSubnets, connected: rtSubnets, routes: map[netip.Prefix]netip.Addr{}}
}

func (f *fakeTable) Subnets() ([]netip.Prefix, error) { return f.subnets, f.err }

func (f *fakeTable) Connected() ([]netip.Prefix, error) { return f.connected, f.err }

func (f *fakeTable) List() ([]netroutes.Route, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []netroutes.Route
	for d, g := range f.routes {
		out = append(out, netroutes.Route{Dst: d, Gateway: g})
	}
	slices.SortFunc(out, func(a, b netroutes.Route) int { return strings.Compare(a.String(), b.String()) })
	return out, f.err
}

func (f *fakeTable) Ensure(r netroutes.Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	if g, ok := f.routes[r.Dst]; !ok || g != r.Gateway {
		f.routes[r.Dst] = r.Gateway
		f.writes++
	}
	return nil
}

func (f *fakeTable) Remove(r netroutes.Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	if g, ok := f.routes[r.Dst]; ok && (!r.Gateway.IsValid() || g == r.Gateway) {
		delete(f.routes, r.Dst)
		f.writes++
	}
	return nil
}

func (f *fakeTable) Reconcile(desired []netroutes.Route) (netroutes.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return netroutes.Result{}, f.err
	}
	want := map[netip.Prefix]netip.Addr{}
	for _, r := range desired {
		want[r.Dst] = r.Gateway
	}
	if !maps.Equal(want, f.routes) {
		f.routes = want
		f.writes++
	}
	return netroutes.Result{}, nil
}

// startRoutes starts r as the CCM does (the provider's SetInformers, with
// its event recorder), with a fake clientset holding nodes, and returns
// the clientset to read events back.
func startRoutes(t *testing.T, r *routes, nodes ...*v1.Node) *fake.Clientset {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	objs := make([]k8sruntime.Object, 0, len(nodes))
	for _, n := range nodes {
		objs = append(objs, n)
	}
	client := fake.NewClientset(objs...)
	factory := informers.NewSharedInformerFactory(client, 0)
	c := &Cloud{routes: r, runCtx: ctx, client: client}
	c.SetInformers(factory)
	factory.Start(ctx.Done())
	t.Cleanup(func() { cancel(); factory.Shutdown() })
	factory.WaitForCacheSync(ctx.Done())
	return client
}

// waitEvent waits for an event on the Node whose reason and message match.
func waitEvent(t *testing.T, client *fake.Clientset, node, reason, msg string) v1.Event {
	t.Helper()
	return waitObjectEvent(t, client, "Node", "", node, reason, msg)
}

// waitObjectEvent waits for an event on the object of kind, namespace and
// name whose reason and message match.
func waitObjectEvent(t *testing.T, client *fake.Clientset, kind, ns, name, reason, msg string) v1.Event {
	t.Helper()
	var found v1.Event
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := client.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			o := e.InvolvedObject
			if o.Kind == kind && o.Namespace == ns && o.Name == name && e.Reason == reason && strings.Contains(e.Message, msg) {
				found = e
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s event on %s %s/%s with %q: %v", reason, kind, ns, name, msg, err)
	}
	return found
}

func TestCreateRouteWithoutBridgeAddressWarnsTheNode(t *testing.T) {
	table := newFakeTable()
	off := rtNode("off-bridge", []string{"10.244.3.0/24"}, "192.168.50.3")
	r := &routes{bridge: "br-test", table: table, cluster: rtCluster}
	client := startRoutes(t, r, off)

	err := r.CreateRoute(context.Background(), "kubernetes", string(off.UID), &cloudprovider.Route{
		TargetNode: "off-bridge", DestinationCIDR: "10.244.3.0/24", TargetNodeAddresses: off.Status.Addresses})
	if !errors.Is(err, errNoRoute) || !strings.Contains(err.Error(), `node "off-bridge"`) || !strings.Contains(err.Error(), "br-test") {
		t.Fatalf("CreateRoute error = %v, want errNoRoute naming the node and the bridge", err)
	}
	if table.writes != 0 {
		t.Errorf("%d route writes for a node that cannot be routed", table.writes)
	}
	ev := waitEvent(t, client, "off-bridge", EventRouteNotCreated, "no IPv4 address on the bridge subnet(s) [10.88.0.0/24]")
	if ev.Type != v1.EventTypeWarning || ev.InvolvedObject.UID != off.UID || ev.Source.Component != "libvirt-cloud-provider" {
		t.Errorf("event = %+v, want a Warning from libvirt-cloud-provider on the Node's UID", ev)
	}
}

func TestCreateRouteRefusesPodCIDRsThatAreNotPods(t *testing.T) {
	table := newFakeTable()
	table.connected = append(slices.Clone(rtSubnets), netip.MustParsePrefix("10.244.9.0/24")) // another network's bridge
	onBridge := func(n *v1.Node, ip string) *v1.Node {
		n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip}}
		return n
	}
	nodes := []*v1.Node{
		onBridge(bornNode("hostile", 1, "128.0.0.0/1"), "10.88.0.11"),
		onBridge(bornNode("outside", 1, "10.245.1.0/24"), "10.88.0.12"),
		onBridge(bornNode("conn", 1, "10.244.9.0/24"), "10.88.0.13"),
		onBridge(bornNode("dup-new", 9, "10.244.5.0/24"), "10.88.0.14"),
		onBridge(bornNode("dup-old", 2, "10.244.5.0/24"), "10.88.0.15"),
	}
	r := &routes{bridge: "br-test", table: table, cluster: rtCluster}
	client := startRoutes(t, r, nodes...)
	ctx := context.Background()
	create := func(r *routes, n *v1.Node) error {
		return r.CreateRoute(ctx, "kubernetes", string(n.UID), &cloudprovider.Route{
			TargetNode: types.NodeName(n.Name), DestinationCIDR: n.Spec.PodCIDRs[0], TargetNodeAddresses: n.Status.Addresses})
	}

	for _, tc := range []struct {
		node *v1.Node
		want string
	}{
		{nodes[0], `node "hostile" pod CIDR 128.0.0.0/1: overlaps 169.254.0.0/16 (link-local)`},
		{nodes[1], `node "outside" pod CIDR 10.245.1.0/24: not inside the cluster CIDR 10.244.0.0/16 (--cluster-cidr)`},
		{nodes[2], `node "conn" pod CIDR 10.244.9.0/24: overlaps 10.244.9.0/24, a subnet connected to this host`},
		{nodes[3], `node "dup-new" pod CIDR 10.244.5.0/24: also claimed by node "dup-old", which keeps it`},
	} {
		err := create(r, tc.node)
		if !errors.Is(err, errNoRoute) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CreateRoute for %s = %v, want errNoRoute with %q", tc.node.Name, err, tc.want)
		}
		waitEvent(t, client, tc.node.Name, EventRouteNotCreated, tc.want)
	}
	if len(table.routes) != 0 || table.writes != 0 {
		t.Fatalf("routes written for refused pod CIDRs: %v", table.routes)
	}
	// The first claimant keeps its CIDR.
	if err := create(r, nodes[4]); err != nil {
		t.Fatalf("CreateRoute for the older claimant: %v", err)
	}
	if gw := table.routes[netip.MustParsePrefix("10.244.5.0/24")]; gw != netip.MustParseAddr("10.88.0.15") {
		t.Errorf("10.244.5.0/24 via %v, want the older claimant's 10.88.0.15", gw)
	}

	// Without --cluster-cidr nothing is routed, and the event says why.
	bare := &routes{bridge: "br-test", table: newFakeTable()}
	client = startRoutes(t, bare, nodes[4])
	if err := create(bare, nodes[4]); !errors.Is(err, errNoRoute) || !strings.Contains(err.Error(), "--cluster-cidr") {
		t.Errorf("CreateRoute without cluster CIDRs = %v, want errNoRoute naming --cluster-cidr", err)
	}
	waitEvent(t, client, "dup-old", EventRouteNotCreated, `node "dup-old" pod CIDR 10.244.5.0/24: no cluster CIDR to check it against: start the CCM with --cluster-cidr`)
}

func TestListRoutesRemovesRoutesOutsideTheClusterCIDR(t *testing.T) {
	table := newFakeTable()
	a := rtNode("a", []string{"10.244.1.0/24"}, "10.88.0.11")
	r := &routes{bridge: "br-test", table: table, cluster: rtCluster}
	startRoutes(t, r, a)
	table.routes[netip.MustParsePrefix("10.244.1.0/24")] = netip.MustParseAddr("10.88.0.11")
	table.routes[netip.MustParsePrefix("64.0.0.0/2")] = netip.MustParseAddr("10.88.0.11") // an older CCM's, for a hostile Node
	table.routes[netip.MustParsePrefix("10.88.0.0/25")] = netip.MustParseAddr("10.88.0.11")

	listed, err := r.ListRoutes(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) != 1 || listed[0].DestinationCIDR != "10.244.1.0/24" || listed[0].TargetNode != "a" {
		t.Errorf("ListRoutes = %v, want a's route only", listed)
	}
	if len(table.routes) != 1 || table.writes != 2 {
		t.Errorf("routes left %v after %d writes, want a's only after 2 removals", table.routes, table.writes)
	}
}

func TestRoutesOverFakes(t *testing.T) {
	table := newFakeTable()
	a := rtNode("a", []string{"10.244.1.0/24", "fd10:244:1::/64"}, "10.88.0.11", "fd00:88::11")
	r := &routes{bridge: "br-test", table: table, cluster: rtCluster}
	startRoutes(t, r, a)
	ctx := context.Background()

	// The route controller passes the Node's addresses; the cache backs them up.
	for _, route := range []*cloudprovider.Route{
		{TargetNode: "a", DestinationCIDR: "10.244.1.0/24", TargetNodeAddresses: a.Status.Addresses},
		{TargetNode: "a", DestinationCIDR: "fd10:244:1::/64"},
		{TargetNode: "a", DestinationCIDR: "10.244.1.0/24", TargetNodeAddresses: a.Status.Addresses}, // again
	} {
		if err := r.CreateRoute(ctx, "kubernetes", string(a.UID), route); err != nil {
			t.Fatalf("CreateRoute %s: %v", route.DestinationCIDR, err)
		}
	}
	if table.writes != 2 {
		t.Errorf("writes = %d, want 2 (the repeated CreateRoute writes nothing)", table.writes)
	}
	table.routes[netip.MustParsePrefix("10.244.7.0/24")] = netip.MustParseAddr("10.88.0.77") // a gone node's

	listed, err := r.ListRoutes(ctx, "kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range listed {
		got = append(got, fmt.Sprintf("%s node=%s blackhole=%v", l.Name, l.TargetNode, l.Blackhole))
	}
	want := []string{
		"10.244.1.0/24 via 10.88.0.11 node=a blackhole=false",
		"10.244.7.0/24 via 10.88.0.77 node= blackhole=true",
		"fd10:244:1::/64 via fd00:88::11 node=a blackhole=false",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("ListRoutes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, l := range listed {
		if l.Blackhole {
			for range 2 { // idempotent
				if err := r.DeleteRoute(ctx, "kubernetes", l); err != nil {
					t.Fatalf("DeleteRoute %s: %v", l.Name, err)
				}
			}
		}
	}
	if _, ok := table.routes[netip.MustParsePrefix("10.244.7.0/24")]; ok || len(table.routes) != 2 {
		t.Errorf("after deleting the blackhole: %v", table.routes)
	}

	table.err = errors.New("netlink says no")
	if _, err := r.ListRoutes(ctx, "kubernetes"); !errors.Is(err, table.err) || !strings.Contains(err.Error(), "br-test") {
		t.Errorf("ListRoutes error = %v, want the table's error wrapped, naming the bridge", err)
	}
	if err := r.CreateRoute(ctx, "kubernetes", "", &cloudprovider.Route{TargetNode: "a", DestinationCIDR: "10.244.1.0/24"}); !errors.Is(err, table.err) {
		t.Errorf("CreateRoute error = %v, want the table's error wrapped", err)
	}
	if err := r.DeleteRoute(ctx, "kubernetes", listed[0]); !errors.Is(err, table.err) {
		t.Errorf("DeleteRoute error = %v, want the table's error wrapped", err)
	}
}

func TestListRoutesWaitsForTheNodeCache(t *testing.T) {
	table := newFakeTable()
	table.routes[netip.MustParsePrefix("10.244.1.0/24")] = netip.MustParseAddr("10.88.0.11")
	r := &routes{bridge: "br-test", table: table, cluster: rtCluster}
	if _, err := r.ListRoutes(context.Background(), ""); err == nil {
		t.Fatal("ListRoutes before start: no error (every route would look orphaned)")
	}
	r.nodes = nodeLister(t, rtNode("a", []string{"10.244.1.0/24"}, "10.88.0.11"))
	var polls atomic.Int32
	r.synced = func() bool { return polls.Add(1) > 3 } // syncs on the 4th look

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.ListRoutes(ctx, ""); err == nil || !strings.Contains(err.Error(), "not synced") {
		t.Fatalf("ListRoutes with an unsynced cache = %v, want a not-synced error", err)
	}
	listed, err := r.ListRoutes(context.Background(), "")
	if err != nil || len(listed) != 1 || listed[0].TargetNode != "a" {
		t.Fatalf("ListRoutes once synced = %v, %v; want the route resolved to a", listed, err)
	}
}

func nodeLister(t *testing.T, nodes ...*v1.Node) corelisters.NodeLister {
	t.Helper()
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, n := range nodes {
		if err := idx.Add(n); err != nil {
			t.Fatal(err)
		}
	}
	return corelisters.NewNodeLister(idx)
}

// --- the provider against the kernel, in a throwaway network namespace ---

// rtLab is a named network namespace with bridge rtbr0 (192.168.77.1/24,
// fd00:77::1/64) and one veth port, so the bridge has carrier.
type rtLab struct {
	name string
	ns   netns.NsHandle
	h    *netlink.Handle
}

func newRtLab(t *testing.T) *rtLab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("provider: this test needs root to create a network namespace with a bridge; run it as root")
	}
	l := &rtLab{name: fmt.Sprintf("lcprov-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)}
	if out, err := exec.Command("ip", "netns", "add", l.name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if l.h != nil {
			l.h.Close()
		}
		if l.ns.IsOpen() {
			l.ns.Close()
		}
		_ = exec.Command("ip", "netns", "del", l.name).Run()
	})
	for _, args := range [][]string{
		{"link", "add", "rtbr0", "type", "bridge"},
		{"addr", "add", "192.168.77.1/24", "dev", "rtbr0"},
		{"addr", "add", "fd00:77::1/64", "dev", "rtbr0", "nodad"},
		{"link", "add", "node0", "master", "rtbr0", "type", "veth", "peer", "name", "node0-p"},
		{"link", "set", "node0", "up"},
		{"link", "set", "node0-p", "up"},
		{"link", "set", "rtbr0", "up"},
	} {
		l.ip(t, args...)
	}
	var err error
	if l.ns, err = netns.GetFromName(l.name); err != nil {
		t.Fatal(err)
	}
	if l.h, err = netlink.NewHandleAt(l.ns); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *rtLab) ip(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"-n", l.name}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// show is `ip route show` for both families, with extra selectors.
func (l *rtLab) show(t *testing.T, args ...string) string {
	t.Helper()
	return l.ip(t, append([]string{"-4", "route", "show"}, args...)...) + l.ip(t, append([]string{"-6", "route", "show"}, args...)...)
}

// inNetns runs f on a thread switched into the lab namespace, so that
// newRoutes' netlink.NewHandle() binds there exactly as it binds to the
// CCM's own namespace in production. The thread is switched back.
func (l *rtLab) inNetns(t *testing.T, f func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	if err := netns.Set(l.ns); err != nil {
		t.Fatal(err)
	}
	f()
	if err := netns.Set(orig); err != nil {
		// Keep the thread locked: the runtime drops it with the goroutine.
		runtime.LockOSThread()
		t.Fatalf("restore netns: %v", err)
	}
}

func TestRoutesAgainstTheKernel(t *testing.T) {
	l := newRtLab(t)
	var r *routes
	var err, missingErr error
	l.inNetns(t, func() {
		r, err = newRoutes(RoutesConfig{Bridge: "rtbr0"}, rtCluster, nil)
		_, missingErr = newRoutes(RoutesConfig{Bridge: "nope0"}, rtCluster, nil)
	})
	if err != nil {
		t.Fatalf("newRoutes: %v", err)
	}
	if missingErr == nil || !strings.Contains(missingErr.Error(), `routes.bridge: bridge "nope0"`) {
		t.Fatalf("newRoutes with a missing bridge = %v, want an error naming the bridge", missingErr)
	}
	mgr := r.table.(*netroutes.Manager)

	a := rtNode("a", []string{"10.244.1.0/24", "fd10:244:1::/64"}, "192.168.77.11", "fd00:77::11")
	b := rtNode("b", []string{"10.244.2.0/24"}, "192.168.77.12")
	off := rtNode("off", []string{"10.244.3.0/24"}, "192.168.50.3")
	// c's pod CIDR is another network's subnet on the host (not the bridge).
	conn := rtNode("c", []string{"10.244.9.0/24"}, "192.168.77.13")
	l.ip(t, "link", "add", "other0", "type", "veth", "peer", "name", "other0-p")
	l.ip(t, "addr", "add", "10.244.9.1/24", "dev", "other0")
	startRoutes(t, r, a, b, off, conn)
	ctx := context.Background()

	// An operator's route to a's pod CIDR, an owned route of a gone node,
	// and an owned route outside the cluster CIDR (an older CCM's).
	l.ip(t, "route", "add", "10.244.1.0/24", "via", "192.168.77.200", "dev", "rtbr0", "proto", "static")
	l.ip(t, "route", "add", "10.244.7.0/24", "via", "192.168.77.77", "dev", "rtbr0", "proto", "76", "metric", "3076")
	l.ip(t, "route", "add", "64.0.0.0/2", "via", "192.168.77.11", "dev", "rtbr0", "proto", "76", "metric", "3076")

	createAll := func() {
		t.Helper()
		for _, n := range []*v1.Node{a, b} {
			for _, cidr := range n.Spec.PodCIDRs {
				route := &cloudprovider.Route{TargetNode: types.NodeName(n.Name), DestinationCIDR: cidr, TargetNodeAddresses: n.Status.Addresses}
				if err := r.CreateRoute(ctx, "kubernetes", string(n.UID), route); err != nil {
					t.Fatalf("CreateRoute %s %s: %v", n.Name, cidr, err)
				}
			}
		}
	}
	createAll()
	want := []string{
		"10.244.1.0/24 via 192.168.77.11 dev rtbr0 proto 76 metric 3076",
		"10.244.2.0/24 via 192.168.77.12 dev rtbr0 proto 76 metric 3076",
		"fd10:244:1::/64 via fd00:77::11 dev rtbr0 proto 76 metric 3076",
		"10.244.1.0/24 via 192.168.77.200 dev rtbr0 proto static",
	}
	out := l.show(t)
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("ip route lacks %q:\n%s", w, out)
		}
	}

	writes := mgr.Writes()
	createAll()
	if w := mgr.Writes() - writes; w != 0 {
		t.Errorf("a second round of CreateRoute made %d netlink writes, want 0", w)
	}

	listed, err := r.ListRoutes(ctx, "kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range listed {
		got = append(got, fmt.Sprintf("%s node=%s blackhole=%v", c.Name, c.TargetNode, c.Blackhole))
	}
	wantListed := []string{
		"10.244.1.0/24 via 192.168.77.11 node=a blackhole=false",
		"10.244.2.0/24 via 192.168.77.12 node=b blackhole=false",
		"10.244.7.0/24 via 192.168.77.77 node= blackhole=true",
		"fd10:244:1::/64 via fd00:77::11 node=a blackhole=false",
	}
	if !slices.Equal(got, wantListed) {
		t.Fatalf("ListRoutes:\n%s\nwant (the foreign route never listed):\n%s", strings.Join(got, "\n"), strings.Join(wantListed, "\n"))
	}
	if out := l.ip(t, "route", "show", "64.0.0.0/2"); strings.TrimSpace(out) != "" {
		t.Errorf("the route outside the cluster CIDR is still there: %s", out)
	}
	for _, c := range listed {
		if c.Blackhole {
			if err := r.DeleteRoute(ctx, "kubernetes", c); err != nil {
				t.Fatal(err)
			}
		}
	}
	if out := l.ip(t, "route", "show", "10.244.7.0/24"); strings.TrimSpace(out) != "" {
		t.Errorf("the blackhole route is still there: %s", out)
	}

	// A Node off the bridge: an error naming it, no route, no crash.
	err = r.CreateRoute(ctx, "kubernetes", string(off.UID), &cloudprovider.Route{TargetNode: "off", DestinationCIDR: "10.244.3.0/24", TargetNodeAddresses: off.Status.Addresses})
	if !errors.Is(err, errNoRoute) || !strings.Contains(err.Error(), `node "off"`) {
		t.Errorf("CreateRoute for a node off the bridge = %v", err)
	}
	if out := l.ip(t, "route", "show", "10.244.3.0/24"); strings.TrimSpace(out) != "" {
		t.Errorf("a route for the node off the bridge: %s", out)
	}
	// A pod CIDR on another link of the host: refused, found by the dump of
	// every link's addresses.
	err = r.CreateRoute(ctx, "kubernetes", string(conn.UID), &cloudprovider.Route{TargetNode: "c", DestinationCIDR: "10.244.9.0/24", TargetNodeAddresses: conn.Status.Addresses})
	if !errors.Is(err, errNoRoute) || !strings.Contains(err.Error(), `node "c" pod CIDR 10.244.9.0/24: overlaps 10.244.9.0/24, a subnet connected to this host`) {
		t.Errorf("CreateRoute for a pod CIDR connected to the host = %v", err)
	}
	if out := l.ip(t, "route", "show", "10.244.9.0/24", "proto", "76"); strings.TrimSpace(out) != "" {
		t.Errorf("a route for the connected pod CIDR: %s", out)
	}

	// `ip route flush proto 76` (a reboot, a daemon cleaning up): the
	// controller sees nothing listed and recreates everything.
	l.ip(t, "-4", "route", "flush", "proto", "76")
	l.ip(t, "-6", "route", "flush", "proto", "76")
	if listed, err := r.ListRoutes(ctx, ""); err != nil || len(listed) != 0 {
		t.Fatalf("after a flush ListRoutes = %v, %v; want none", listed, err)
	}
	createAll()
	out = l.show(t)
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("after flush and CreateRoute, ip route lacks %q:\n%s", w, out)
		}
	}

	// DeleteRoute is exact and idempotent; the foreign route stays.
	listed, err = r.ListRoutes(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range listed {
		for range 2 {
			if err := r.DeleteRoute(ctx, "", c); err != nil {
				t.Fatalf("DeleteRoute %s: %v", c.Name, err)
			}
		}
	}
	if out := l.show(t, "proto", "76"); strings.TrimSpace(out) != "" {
		t.Errorf("owned routes left after deleting all: %s", out)
	}
	if out := l.ip(t, "route", "show", "10.244.1.0/24"); !strings.Contains(out, "via 192.168.77.200 dev rtbr0 proto static") {
		t.Errorf("the foreign route was touched: %q", out)
	}
}

// Hosts on separate segments: a Node on another host with no address on
// this bridge is routed on its own host (and for the LAN over BGP). The
// route controller is told its route is in place, so it does not mark the
// Node's network unavailable; this host writes nothing for it. A Node on
// this host without an address on the bridge is still refused.
func TestRoutesLeaveOtherHostsNodesToThem(t *testing.T) {
	table := newFakeTable()
	remote := rtNode("remote", []string{"10.244.5.0/24"}, "10.77.5.10")
	remote.Labels = map[string]string{v1.LabelTopologyZone: "z2"}
	local := rtNode("local-off-bridge", []string{"10.244.6.0/24"}, "10.77.6.10")
	local.Labels = map[string]string{v1.LabelTopologyZone: "z1"}
	cfg := resolvedOf(t, Config{Host: "kvm1", Hypervisors: []HypervisorConfig{{URI: "qemu:///system", Zone: "z1", Host: "kvm1"}, {URI: "qemu+ssh://kvm2/system", Zone: "z2", Host: "kvm2"}}})
	r := &routes{bridge: "br-test", table: table, cluster: rtCluster, otherHost: cfg.onOtherHost()}
	startRoutes(t, r, remote, local)
	ctx := context.Background()
	if err := r.CreateRoute(ctx, "kubernetes", string(remote.UID), &cloudprovider.Route{TargetNode: "remote", DestinationCIDR: "10.244.5.0/24"}); err != nil {
		t.Errorf("CreateRoute for another host's Node: %v, want nil", err)
	}
	if table.writes != 0 {
		t.Errorf("%d route writes for another host's Node", table.writes)
	}
	if err := r.CreateRoute(ctx, "kubernetes", string(local.UID), &cloudprovider.Route{TargetNode: "local-off-bridge", DestinationCIDR: "10.244.6.0/24"}); !errors.Is(err, errNoRoute) {
		t.Errorf("CreateRoute for this host's Node off the bridge: %v, want errNoRoute", err)
	}
	listed, err := r.ListRoutes(ctx, "kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) != 1 || listed[0].TargetNode != "remote" || listed[0].DestinationCIDR != "10.244.5.0/24" || listed[0].Blackhole {
		t.Fatalf("ListRoutes = %+v, want the remote Node's pod CIDR only", listed)
	}
	if err := r.DeleteRoute(ctx, "kubernetes", listed[0]); err != nil || table.writes != 0 {
		t.Errorf("DeleteRoute of the remote Node's route: %v, %d writes; want nothing done here", err, table.writes)
	}
	if one := resolvedOf(t, Config{Host: "kvm1", Hypervisors: cfg.Hypervisors[:1]}); one.onOtherHost() != nil {
		t.Error("with one host every Node is this host's")
	}
}

// TestOverlappingPodCIDRsAgainstTheKernel is hostile.sh's part (3) on a
// bridge of the test's own: Nodes made after node-1, with node-1's
// InternalIP, inside its /24 and over the whole cluster CIDR, get no route
// and a Warning; a benign one made with them gets its route.
func TestOverlappingPodCIDRsAgainstTheKernel(t *testing.T) {
	l := newRtLab(t)
	var r *routes
	var err error
	l.inNetns(t, func() { r, err = newRoutes(RoutesConfig{Bridge: "rtbr0"}, rtCluster, nil) })
	if err != nil {
		t.Fatal(err)
	}
	nodes := hostileNodes("192.168.77.11")
	client := startRoutes(t, r, nodes...)
	refused := map[string]string{
		"acc-overlap": `overlaps 10.244.1.0/24 of node "node-1"`,
		"acc-wide":    "the whole cluster CIDR 10.244.0.0/16",
	}
	for _, n := range nodes {
		err := r.CreateRoute(context.Background(), "kubernetes", string(n.UID), &cloudprovider.Route{
			TargetNode: types.NodeName(n.Name), DestinationCIDR: n.Spec.PodCIDRs[0], TargetNodeAddresses: n.Status.Addresses})
		if why := refused[n.Name]; why == "" && err != nil || why != "" && (!errors.Is(err, errNoRoute) || !strings.Contains(err.Error(), why)) {
			t.Errorf("CreateRoute for %s: %v, want %q", n.Name, err, why)
		}
	}
	for name, why := range refused {
		waitEvent(t, client, name, EventRouteNotCreated, why)
	}
	got := l.show(t, "proto", "76")
	want := "10.244.1.0/24 via 192.168.77.11 dev rtbr0 metric 3076 \n10.244.250.0/24 via 192.168.77.11 dev rtbr0 metric 3076 \n"
	if got != want {
		t.Errorf("routes of proto 76:\n%s\nwant:\n%s", got, want)
	}
}
