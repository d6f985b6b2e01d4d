package provider

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"

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
		eligible  map[netip.Addr][]string
		affinity  map[netip.Addr]bool
		want      map[string]string
	}{
		{"every eligible node", map[netip.Addr]string{vip: "b"}, map[netip.Addr][]string{vip: {"a", "b", "c"}}, nil,
			map[string]string{"10.0.0.200/32": "[10.0.0.11 10.0.0.12 10.0.0.13]"}},
		{"ClientIP affinity: the answering node alone", map[netip.Addr]string{vip: "b"}, map[netip.Addr][]string{vip: {"a", "b", "c"}}, map[netip.Addr]bool{vip: true},
			map[string]string{"10.0.0.200/32": "[10.0.0.12]"}},
		{"answering node kept outside the eligible set", map[netip.Addr]string{vip: "c"}, map[netip.Addr][]string{vip: {"a", "b"}}, nil,
			map[string]string{"10.0.0.200/32": "[10.0.0.13]"}},
		{"a node without a bridge address is left out", map[netip.Addr]string{vip: "a"}, map[netip.Addr][]string{vip: {"a", "d"}}, nil,
			map[string]string{"10.0.0.200/32": "[10.0.0.11]"}},
		{"answering node without an address: no route", map[netip.Addr]string{vip: "d", vip2: "a"}, map[netip.Addr][]string{vip: {"a", "d"}, vip2: {"a", "b"}}, nil,
			map[string]string{"10.0.0.201/32": "[10.0.0.11 10.0.0.12]"}},
		{"unanswered VIPs get none", nil, map[netip.Addr][]string{vip: {"a"}}, nil, map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := show(vipPaths(tc.answering, tc.eligible, tc.affinity, addr))
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("vipPaths = %v, want %v", got, tc.want)
			}
		})
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
