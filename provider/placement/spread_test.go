package placement

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/netroutes"
)

func TestVIPPaths(t *testing.T) {
	vip, vip2 := netip.MustParseAddr("10.0.0.200"), netip.MustParseAddr("10.0.0.201")
	addrs := map[string]string{"a": "10.0.0.11", "b": "10.0.0.12", "c": "10.0.0.13"} // d has none
	addr := func(node string, _ netip.Addr) (netip.Addr, bool) {
		a, ok := addrs[node]
		if !ok {
			return netip.Addr{}, false
		}
		return netip.MustParseAddr(a), true
	}
	show := func(ps []netroutes.Paths) map[string]string {
		out := map[string]string{}
		for _, p := range ps {
			gws := slices.Clone(p.Gateways)
			slices.SortFunc(gws, netip.Addr.Compare)
			out[p.Dst.String()] = fmt.Sprint(gws)
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		answering map[netip.Addr]string
		ranked    map[netip.Addr][]string
		affinity  map[netip.Addr]bool
		want      map[string]string
	}{
		{"every ranked node", map[netip.Addr]string{vip: "b"}, map[netip.Addr][]string{vip: {"a", "b", "c"}}, nil,
			map[string]string{"10.0.0.200/32": "[10.0.0.11 10.0.0.12 10.0.0.13]"}},
		{"ClientIP affinity: the answering node alone", map[netip.Addr]string{vip: "b"}, map[netip.Addr][]string{vip: {"a", "b", "c"}}, map[netip.Addr]bool{vip: true},
			map[string]string{"10.0.0.200/32": "[10.0.0.12]"}},
		{"answering node kept outside the ranked set", map[netip.Addr]string{vip: "c"}, map[netip.Addr][]string{vip: {"a", "b"}}, nil,
			map[string]string{"10.0.0.200/32": "[10.0.0.13]"}},
		{"a node without a bridge address is left out", map[netip.Addr]string{vip: "a"}, map[netip.Addr][]string{vip: {"a", "d"}}, nil,
			map[string]string{"10.0.0.200/32": "[10.0.0.11]"}},
		{"answering node without an address: no route", map[netip.Addr]string{vip: "d", vip2: "a"}, map[netip.Addr][]string{vip: {"a", "d"}, vip2: {"a", "b"}}, nil,
			map[string]string{"10.0.0.201/32": "[10.0.0.11 10.0.0.12]"}},
		{"unanswered VIPs get none", nil, map[netip.Addr][]string{vip: {"a"}}, nil, map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := show(vipPaths(tc.answering, tc.ranked, tc.affinity, addr))
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("vipPaths = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestVIPPathsCapped: a VIP eligible on 1000 nodes gets maxSpreadPaths
// next hops (the answering node's among them), not 1000: a route with a next hop
// per node made every placement pass dump and parse megabytes of routes,
// and was too large for `ip route` to list. The choice is stable (rendezvous
// hashing): a node leaving changes only the routes that named it, by one
// next hop, and different VIPs spread over different nodes. It ranks and
// routes as a pass does (placeAndRoute).
func TestVIPPathsCapped(t *testing.T) {
	const n = 1000
	nodes, addrs := manyNodes(n)
	addr := func(node string, _ netip.Addr) (netip.Addr, bool) { a, ok := addrs[node]; return a, ok }
	vips := make([]netip.Addr, 100)
	eligible := map[netip.Addr][]string{}
	for i := range vips {
		vips[i] = netip.AddrFrom4([4]byte{10, 2, 0, byte(i)})
		eligible[vips[i]] = nodes
	}
	routes := func(eligible map[netip.Addr][]string) (map[netip.Addr]string, map[netip.Addr][]netip.Addr) {
		answering, paths := placeAndRoute(eligible, addr)
		out := map[netip.Addr][]netip.Addr{}
		for _, p := range paths {
			out[p.Dst.Addr()] = p.Gateways
		}
		return answering, out
	}
	answering, before := routes(eligible)
	used := map[netip.Addr]bool{}
	for _, vip := range vips {
		gws := before[vip]
		if len(gws) != maxSpreadPaths || !slices.Contains(gws, addrs[answering[vip]]) {
			t.Fatalf("%s: %d next hops %v, want %d with the answering node's %s", vip, len(gws), gws, maxSpreadPaths, addrs[answering[vip]])
		}
		for _, g := range gws {
			used[g] = true
		}
	}
	if len(used) < 500 {
		t.Errorf("100 VIPs spread over only %d of %d nodes", len(used), n)
	}

	// The first VIP's last next hop leaves (its Node goes NotReady).
	gone := before[vips[0]][maxSpreadPaths-1]
	var goneNode string
	for name, a := range addrs {
		if a == gone {
			goneNode = name
		}
	}
	left := slices.DeleteFunc(slices.Clone(nodes), func(s string) bool { return s == goneNode })
	for _, vip := range vips {
		eligible[vip] = left
	}
	_, after := routes(eligible)
	for _, vip := range vips {
		removed := 0
		for _, g := range before[vip] {
			if !slices.Contains(after[vip], g) {
				removed++
			}
		}
		switch {
		case len(after[vip]) != maxSpreadPaths:
			t.Errorf("%s: %d next hops after a node left", vip, len(after[vip]))
		case slices.Contains(before[vip], gone) && removed != 1:
			t.Errorf("%s named the node that left; %d of its next hops changed, want 1", vip, removed)
		case !slices.Contains(before[vip], gone) && removed != 0:
			t.Errorf("%s did not name the node that left, yet %d of its next hops changed", vip, removed)
		}
	}
}

func TestBridgeAddress(t *testing.T) {
	subnets := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::/64")}
	n := &v1.Node{Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
		{Type: v1.NodeExternalIP, Address: "10.0.0.99"},
		{Type: v1.NodeInternalIP, Address: "192.168.1.5"}, // another network
		{Type: v1.NodeInternalIP, Address: "10.0.0.11"},
		{Type: v1.NodeInternalIP, Address: "fd00::11"},
	}}}
	if a, ok := bridgeAddress(n, subnets, true); !ok || a.String() != "10.0.0.11" {
		t.Errorf("IPv4 = %v %v, want 10.0.0.11", a, ok)
	}
	if a, ok := bridgeAddress(n, subnets, false); !ok || a.String() != "fd00::11" {
		t.Errorf("IPv6 = %v %v, want fd00::11", a, ok)
	}
	if _, ok := bridgeAddress(n, subnets[:0], true); ok {
		t.Error("found an address with no bridge subnet")
	}
	if _, ok := bridgeAddress(nil, subnets, true); ok {
		t.Error("found an address of a Node not listed")
	}
}

// manyNodes names n nodes and gives each an address on the bridge.
func manyNodes(n int) ([]string, map[string]netip.Addr) {
	nodes := make([]string, n)
	addrs := map[string]netip.Addr{}
	for i := range nodes {
		nodes[i] = fmt.Sprintf("node-%04d", i)
		addrs[nodes[i]] = netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
	}
	return nodes, addrs
}

// placeAndRoute ranks and routes as a placement pass does: every VIP's
// first ranked node answers it.
func placeAndRoute(eligible map[netip.Addr][]string, addr func(string, netip.Addr) (netip.Addr, bool)) (map[netip.Addr]string, []netroutes.Paths) {
	ranked := lb.Place(eligible, maxSpreadPaths)
	answering := map[netip.Addr]string{}
	for vip, r := range ranked {
		answering[vip] = r[0]
	}
	return answering, vipPaths(answering, ranked, nil, addr)
}

// BenchmarkVIPPaths: one placement pass's ranking and routes for 1000 VIPs,
// each eligible on the same 1000 nodes.
func BenchmarkVIPPaths(b *testing.B) {
	const n = 1000
	nodes, addrs := manyNodes(n)
	addr := func(node string, _ netip.Addr) (netip.Addr, bool) { a, ok := addrs[node]; return a, ok }
	eligible := map[netip.Addr][]string{}
	for i := range n {
		eligible[netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)})] = nodes
	}
	for b.Loop() {
		placeAndRoute(eligible, addr)
	}
}
