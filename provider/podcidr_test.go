package provider

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	cloudprovider "k8s.io/cloud-provider"

	"github.com/labcloud/labcloud/netroutes"
)

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ss))
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// rtCluster is the shipped --cluster-cidr plus an IPv6 one for the IPv6 cases.
var rtCluster = prefixes("10.244.0.0/16", "fd10:244::/32")

// bornNode is a Node created at minute m of some day, claiming cidrs.
func bornNode(name string, m int, cidrs ...string) *v1.Node {
	n := rtNode(name, cidrs)
	n.CreationTimestamp = metav1.NewTime(time.Date(2026, 11, 26, 10, m, 0, 0, time.UTC))
	return n
}

func TestParseClusterCIDRs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // joined by ",", or the error's substring after "error: "
	}{
		{in: "", want: ""},
		{in: "  ", want: ""},
		{in: "10.244.0.0/16", want: "10.244.0.0/16"},
		{in: " 10.244.0.0/16 ", want: "10.244.0.0/16"},
		{in: "10.244.0.0/16,fd10:244::/56", want: "10.244.0.0/16,fd10:244::/56"},
		{in: "10.244.7.0/16", want: "10.244.0.0/16"}, // host bits ignored, as upstream
		{in: "10.244.0.0/33", want: `error: --cluster-cidr="10.244.0.0/33": "10.244.0.0/33" is not a CIDR`},
		{in: "10.244.0.0", want: `error: --cluster-cidr="10.244.0.0": "10.244.0.0" is not a CIDR`},
		{in: "10.244.0.0/16,", want: `error: --cluster-cidr="10.244.0.0/16,": "" is not a CIDR`},
		{in: "10.244.0.0/16, fd10::/56", want: `error: --cluster-cidr="10.244.0.0/16, fd10::/56": " fd10::/56" is not a CIDR`},
		{in: "10.244.0.0/16,10.245.0.0/16", want: "error: more than one IPv4 CIDR"},
		{in: "10.244.0.0/0", want: `error: --cluster-cidr="10.244.0.0/0": 0.0.0.0/0 overlaps 0.0.0.0/8`},
		{in: "224.0.0.0/8", want: "error: --cluster-cidr=\"224.0.0.0/8\": 224.0.0.0/8 overlaps 224.0.0.0/4 (multicast)"},
		{in: "fe80::/64", want: "error: overlaps fe80::/10 (link-local)"},
	} {
		got, err := ParseClusterCIDRs(tc.in)
		if want, isErr := strings.CutPrefix(tc.want, "error: "); isErr {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("ParseClusterCIDRs(%q) = %v, %v; want an error containing %q", tc.in, got, err, want)
			}
			continue
		}
		if err != nil || joinPrefixes(got) != tc.want {
			t.Errorf("ParseClusterCIDRs(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

func TestPodCIDRRefusal(t *testing.T) {
	rules := podCIDRRules{cluster: rtCluster, connected: prefixes("10.88.0.0/24", "192.0.2.0/24", "10.244.9.0/25", "fd00:88::/64", "fe80::/64")}
	for _, tc := range []struct {
		name  string
		cidr  string
		rules *podCIDRRules // default rules
		want  string        // substring of the refusal; "" when accepted
	}{
		{name: "inside the cluster CIDR", cidr: "10.244.250.0/24"},
		{name: "the whole cluster CIDR", cidr: "10.244.0.0/16", want: "the whole cluster CIDR 10.244.0.0/16, every Node's pods"},
		{name: "the whole IPv6 cluster CIDR", cidr: "fd10:244::/32", want: "the whole cluster CIDR fd10:244::/32"},
		{name: "half the Internet", cidr: "128.0.0.0/1", want: "overlaps 169.254.0.0/16 (link-local), which is never pod traffic"},
		{name: "a quarter of the Internet", cidr: "64.0.0.0/2", want: "overlaps 127.0.0.0/8 (loopback)"},
		{name: "an eighth of the Internet", cidr: "32.0.0.0/3", want: "not inside the cluster CIDR 10.244.0.0/16 (--cluster-cidr)"},
		{name: "IPv4 default route", cidr: "0.0.0.0/0", want: "a default route"},
		{name: "this network", cidr: "0.0.0.0/24", want: "overlaps 0.0.0.0/8 (this network)"},
		{name: "loopback", cidr: "127.0.0.0/24", want: "overlaps 127.0.0.0/8 (loopback)"},
		{name: "link-local", cidr: "169.254.0.0/24", want: "overlaps 169.254.0.0/16 (link-local)"},
		{name: "multicast", cidr: "239.1.0.0/24", want: "overlaps 224.0.0.0/4 (multicast)"},
		{name: "broadcast", cidr: "255.255.255.255/32", want: "overlaps 240.0.0.0/4 (reserved"},
		{name: "outside the cluster CIDR", cidr: "10.245.1.0/24", want: "not inside the cluster CIDR 10.244.0.0/16"},
		{name: "larger than the cluster CIDR", cidr: "10.244.0.0/15", want: "not inside the cluster CIDR"},
		{name: "a LAN", cidr: "192.168.1.0/24", want: "not inside the cluster CIDR"},
		{name: "a connected subnet inside the cluster CIDR", cidr: "10.244.9.0/24", want: "overlaps 10.244.9.0/25, a subnet connected to this host"},
		{name: "inside a connected subnet", cidr: "10.244.9.0/26", want: "overlaps 10.244.9.0/25, a subnet connected"},
		{name: "cluster CIDR over another libvirt network", cidr: "10.88.0.0/24",
			rules: &podCIDRRules{cluster: prefixes("10.0.0.0/8"), connected: prefixes("10.88.0.0/24")}, want: "overlaps 10.88.0.0/24, a subnet connected"},
		{name: "no cluster CIDR", cidr: "10.244.5.0/24", rules: &podCIDRRules{}, want: "start the CCM with --cluster-cidr"},

		{name: "IPv6 inside", cidr: "fd10:244:1::/64"},
		{name: "IPv6 default route", cidr: "::/0", want: "a default route"},
		{name: "IPv6 unspecified", cidr: "::/128", want: "overlaps ::/128 (the unspecified address)"},
		{name: "IPv6 loopback", cidr: "::1/128", want: "overlaps ::1/128 (loopback)"},
		{name: "IPv4-mapped", cidr: "::ffff:10.244.1.0/120", want: "overlaps ::ffff:0.0.0.0/96 (IPv4-mapped)"},
		{name: "IPv6 link-local", cidr: "fe80::/64", want: "overlaps fe80::/10 (link-local)"},
		{name: "IPv6 multicast", cidr: "ff02::/16", want: "overlaps ff00::/8 (multicast)"},
		{name: "IPv6 half the Internet", cidr: "8000::/1", want: "overlaps fe80::/10"},
		{name: "IPv6 outside", cidr: "fd11::/64", want: "not inside the cluster CIDR fd10:244::/32"},
		{name: "IPv6 connected", cidr: "fd00:88::/64", rules: &podCIDRRules{cluster: prefixes("fd00::/8"), connected: prefixes("fd00:88::/64")}, want: "overlaps fd00:88::/64, a subnet connected"},
		{name: "IPv6 without an IPv6 cluster CIDR", cidr: "fd10:244:1::/64", rules: &podCIDRRules{cluster: prefixes("10.244.0.0/16")},
			want: "no IPv6 cluster CIDR (--cluster-cidr=10.244.0.0/16)"},
		{name: "IPv4 without an IPv4 cluster CIDR", cidr: "10.244.1.0/24", rules: &podCIDRRules{cluster: prefixes("fd10:244::/32")},
			want: "no IPv4 cluster CIDR (--cluster-cidr=fd10:244::/32)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rules
			if tc.rules != nil {
				r = *tc.rules
			}
			got := r.refusal(netip.MustParsePrefix(tc.cidr))
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Fatalf("refusal(%s) = %q, want %q", tc.cidr, got, tc.want)
			}
		})
	}
}

// TestPodCIDRClaims: oldest Node first, each pod CIDR is kept unless it
// overlaps one kept for another Node; a CIDR refused on its own keeps
// nothing from anyone; the cache's order does not matter.
func TestPodCIDRClaims(t *testing.T) {
	nodes := []*v1.Node{
		bornNode("new", 30, "10.244.5.0/24"),
		bornNode("old", 10, "10.244.5.0/24", "fd10:244:5::/64"),
		bornNode("twin-b", 20, "10.244.6.0/24"),
		bornNode("twin-a", 20, "10.244.6.7/24"), // host bits: the same CIDR
		bornNode("alone", 40, "10.244.7.0/24"),
		bornNode("inside-old", 31, "10.244.5.128/25"),
		bornNode("around-old", 32, "10.244.4.0/23"),
		bornNode("v6-inside", 33, "fd10:244:5::/80"),
		bornNode("whole", 1, "10.244.0.0/16"),      // refused on its own, older than all
		bornNode("outside", 2, "10.245.0.0/16"),    // refused on its own
		bornNode("in-whole", 50, "10.244.60.0/24"), // inside whole's and outside's claims: kept
	}
	legacy := bornNode("legacy", 5)
	legacy.Spec.PodCIDR = "10.244.8.0/24" // only the singular field
	later := bornNode("later", 50, "10.244.8.0/24")
	nodes = append(nodes, later, legacy)
	rules := podCIDRRules{cluster: rtCluster}

	for _, tc := range []struct {
		node, cidr string
		want       string // substring of the refusal; "" when routed
	}{
		{"old", "10.244.5.0/24", ""},
		{"new", "10.244.5.0/24", `also claimed by node "old", which keeps it (the oldest claiming Node, ties broken by name)`},
		{"old", "fd10:244:5::/64", ""},
		{"twin-a", "10.244.6.0/24", ""},
		{"twin-b", "10.244.6.0/24", `also claimed by node "twin-a"`},
		{"alone", "10.244.7.0/24", ""},
		{"inside-old", "10.244.5.128/25", `overlaps 10.244.5.0/24 of node "old", which keeps it`},
		{"around-old", "10.244.4.0/23", `overlaps 10.244.5.0/24 of node "old"`},
		{"v6-inside", "fd10:244:5::/80", `overlaps fd10:244:5::/64 of node "old"`},
		{"whole", "10.244.0.0/16", "the whole cluster CIDR"},
		{"outside", "10.245.0.0/16", "not inside the cluster CIDR"},
		{"in-whole", "10.244.60.0/24", ""},
		{"legacy", "10.244.8.0/24", ""},
		{"later", "10.244.8.0/24", `also claimed by node "legacy"`},
		// Claims no Node makes (a route's gateway Node, a Node not cached
		// yet) are judged as the youngest.
		{"nobody", "10.244.9.0/24", ""},
		{"nobody", "10.244.7.128/25", `overlaps 10.244.7.0/24 of node "alone"`},
		{"alone", "10.244.7.0/25", ""}, // inside its own
		{"nobody", "10.244.0.0/16", "the whole cluster CIDR"},
	} {
		p := netip.MustParsePrefix(tc.cidr)
		rev := slices.Clone(nodes)
		slices.Reverse(rev)
		for _, order := range [][]*v1.Node{nodes, rev} {
			got := rules.judge(order).refusal(tc.node, p)
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Errorf("%s's %s: refusal %q, want %q", tc.node, tc.cidr, got, tc.want)
			}
		}
	}
}

func TestControllerDeletes(t *testing.T) {
	// Upstream's isResponsibleForRoute: the first or the last address of the
	// route inside a cluster CIDR.
	for cidr, want := range map[string]bool{
		"10.244.1.0/24":   true,
		"10.244.0.0/16":   true,
		"10.244.0.0/15":   true, // first address inside
		"10.243.0.0/16":   false,
		"10.0.0.0/8":      false, // neither end inside
		"128.0.0.0/1":     false,
		"0.0.0.0/0":       false,
		"10.245.0.0/16":   false,
		"fd10:244:1::/64": true,
		"fd11::/64":       false,
	} {
		if got := controllerDeletes(netip.MustParsePrefix(cidr), rtCluster); got != want {
			t.Errorf("controllerDeletes(%s) = %v, want %v", cidr, got, want)
		}
	}
	if got := lastAddr(netip.MustParsePrefix("10.243.0.0/15")); got != netip.MustParseAddr("10.243.255.255") {
		t.Errorf("lastAddr(10.243.0.0/15) = %s", got) // masked first: 10.242.0.0/15
	}
}

func TestCloudRoutesRefused(t *testing.T) {
	nodes := []*v1.Node{
		bornNode("a", 1, "10.244.1.0/24", "128.0.0.0/1"),
		bornNode("b", 5, "10.244.2.0/24"),
		bornNode("c", 2, "10.244.2.0/24"), // older: keeps 10.244.2.0/24
		bornNode("d", 3, "10.244.9.0/24"),
	}
	for i, ip := range []string{"10.88.0.11", "10.88.0.12", "10.88.0.13", "10.88.0.14"} {
		nodes[i].Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip}}
	}
	owned := []netroutes.Route{
		rtRoute("0.0.0.0/0", "10.88.0.77"),     // nobody's, outside: stray
		rtRoute("10.244.0.0/15", "10.88.0.11"), // straddles the cluster CIDR: the controller deletes it
		rtRoute("10.244.1.0/24", "10.88.0.11"),
		rtRoute("10.244.2.0/24", "10.88.0.12"), // b's, but c keeps the CIDR
		rtRoute("10.244.9.0/24", "10.88.0.14"), // overlaps a connected subnet
		rtRoute("10.245.0.0/24", "10.88.0.11"), // outside: stray
		rtRoute("128.0.0.0/1", "10.88.0.11"),   // a claims it; stray all the same
		rtRoute("fd10:244:1::/64", "fd00:88::11"),
	}
	rules := podCIDRRules{cluster: prefixes("10.244.0.0/16"), connected: prefixes("10.88.0.0/24", "10.244.9.128/25")}
	listed, stray := cloudRoutes(owned, nodes, rules)
	var got []string
	for _, l := range listed {
		got = append(got, l.Name+" node="+string(l.TargetNode)+map[bool]string{true: " blackhole", false: ""}[l.Blackhole])
	}
	want := []string{
		"10.244.0.0/15 via 10.88.0.11 node= blackhole",
		"10.244.1.0/24 via 10.88.0.11 node=a",
		"10.244.2.0/24 via 10.88.0.12 node= blackhole",
		"10.244.9.0/24 via 10.88.0.14 node= blackhole",
	}
	if !slices.Equal(got, want) {
		t.Errorf("listed:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	got = nil
	for _, s := range stray {
		got = append(got, s.route.String()+": "+s.reason)
	}
	want = []string{
		"0.0.0.0/0 via 10.88.0.77: a default route, which would capture all traffic",
		"10.245.0.0/24 via 10.88.0.11: not inside the cluster CIDR 10.244.0.0/16 (--cluster-cidr)",
		"128.0.0.0/1 via 10.88.0.11: overlaps 169.254.0.0/16 (link-local), which is never pod traffic",
		"fd10:244:1::/64 via fd00:88::11: no IPv6 cluster CIDR (--cluster-cidr=10.244.0.0/16)",
	}
	if !slices.Equal(got, want) {
		t.Errorf("stray:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Without cluster CIDRs (the route controller does not run then)
	// nothing is judged: only routes without a Node are blackholes.
	listed, stray = cloudRoutes(owned, nodes, podCIDRRules{})
	if len(stray) != 0 || len(listed) != len(owned) {
		t.Fatalf("without cluster CIDRs: %d listed, stray %v", len(listed), stray)
	}
	for _, l := range listed {
		if l.Blackhole != (l.DestinationCIDR == "0.0.0.0/0" || l.DestinationCIDR == "fd10:244:1::/64") {
			t.Errorf("without cluster CIDRs: %+v", *l)
		}
	}
}

// TestOverlappingPodCIDRs: as hostile.sh makes them, Nodes created after
// node-1 with node-1's InternalIP: one inside node-1's /24, one with the
// whole cluster CIDR, and a benign one. Neither the overlapping nor the
// whole get a route (CreateRoute, a following replica) or a BGP route, and
// ListRoutes blackholes theirs; node-1 and the benign Node get both, even
// though the benign CIDR lies inside the older whole-cluster claim, which
// is refused on its own and so keeps nothing from anyone.
func TestOverlappingPodCIDRs(t *testing.T) {
	nodes := hostileNodes("10.88.0.11")
	rules := podCIDRRules{cluster: rtCluster, connected: rtSubnets}
	want := map[string]string{ // pod CIDR → the Node it is routed to; "" refused
		"10.244.1.0/24":   "node-1",
		"10.244.250.0/24": "acc-benign",
		"10.244.1.128/25": "",
		"10.244.0.0/16":   "",
	}
	wantWhy := map[string]string{
		"10.244.1.128/25": `overlaps 10.244.1.0/24 of node "node-1", which keeps it`,
		"10.244.0.0/16":   "the whole cluster CIDR 10.244.0.0/16",
	}
	gw := netip.MustParseAddr("10.88.0.11")

	// A following replica's routes.
	got := map[string]bool{}
	for _, r := range followedRoutes(nodes, rtSubnets, rules) {
		got[r.Dst.String()] = r.Gateway == gw
	}
	// The BGP routes of this host (every Node's, with one host).
	bgpGot := map[string]bool{}
	routes, refused := bgpRoutes(nodes, rules, func(*v1.Node) bool { return true })
	for _, r := range routes {
		bgpGot[r.Prefix.String()] = r.NextHop == gw
	}
	// ListRoutes over a route to each, as an earlier CCM may have left.
	var owned []netroutes.Route
	for cidr := range want {
		owned = append(owned, rtRoute(cidr, gw.String()))
	}
	listed, stray := cloudRoutes(owned, nodes, rules)
	if len(stray) != 0 {
		t.Errorf("stray routes %v: every CIDR is inside the cluster CIDR, for the route controller to delete", stray)
	}
	for cidr, node := range want {
		if got[cidr] != (node != "") || bgpGot[cidr] != (node != "") {
			t.Errorf("%s: routed %v, announced %v; want both %v", cidr, got[cidr], bgpGot[cidr], node != "")
		}
		if i := slices.IndexFunc(listed, func(r *cloudprovider.Route) bool { return r.DestinationCIDR == cidr }); i < 0 {
			t.Errorf("ListRoutes does not list %s", cidr)
		} else if listed[i].Blackhole != (node == "") || string(listed[i].TargetNode) != node {
			t.Errorf("ListRoutes lists %s as %+v, want node %q (a blackhole if none)", cidr, *listed[i], node)
		}
		// CreateRoute, as the route controller calls it for the Node
		// claiming the CIDR.
		claimant := nodes[slices.IndexFunc(nodes, func(n *v1.Node) bool { return n.Spec.PodCIDRs[0] == cidr })]
		_, problem := planRoute(routeFacts{subnets: rtSubnets, rules: rules, nodes: nodes},
			&cloudprovider.Route{TargetNode: types.NodeName(claimant.Name), DestinationCIDR: cidr, TargetNodeAddresses: claimant.Status.Addresses})
		if why := wantWhy[cidr]; why == "" && problem != nil || why != "" && (problem == nil || !strings.Contains(problem.Reason, why)) {
			t.Errorf("CreateRoute for %s of %s: %v, want %q", cidr, claimant.Name, problem, why)
		}
		if why := wantWhy[cidr]; why != "" && !slices.ContainsFunc(refused, func(r string) bool { return strings.Contains(r, cidr) && strings.Contains(r, why) }) {
			t.Errorf("BGP refusals %q lack %s: %s", refused, cidr, why)
		}
	}
}

// hostileNodes are hostile.sh's part (3), all with InternalIP ip: node-1,
// then Nodes made later inside its /24, over the whole cluster CIDR (a
// minute before the rest) and a benign one.
func hostileNodes(ip string) []*v1.Node {
	nodes := []*v1.Node{
		bornNode("node-1", 1, "10.244.1.0/24"),
		bornNode("acc-overlap", 30, "10.244.1.128/25"),
		bornNode("acc-wide", 29, "10.244.0.0/16"),
		bornNode("acc-benign", 30, "10.244.250.0/24"),
	}
	for _, n := range nodes {
		n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip}}
	}
	return nodes
}
