package nodeagent

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func lbService(name string, ports []v1.ServicePort, ingress ...v1.LoadBalancerIngress) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, Ports: ports},
		Status:     v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: ingress}},
	}
}

func tcp(p int32) v1.ServicePort { return v1.ServicePort{Port: p, Protocol: v1.ProtocolTCP} }

func ips(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, x := range s {
		out = append(out, netip.MustParseAddr(x))
	}
	return out
}

func aps(s ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, x := range s {
		out = append(out, netip.MustParseAddrPort(x))
	}
	return out
}

func pfx(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}

func TestPlanVIPs(t *testing.T) {
	vip := func(ip string) v1.LoadBalancerIngress { return v1.LoadBalancerIngress{IP: ip} }
	clusterIP := lbService("cip", []v1.ServicePort{tcp(80)}, vip("192.168.100.9"))
	clusterIP.Spec.Type = v1.ServiceTypeClusterIP

	tests := []struct {
		name     string
		services []*v1.Service
		want     VIPPlan
	}{{
		name: "none",
	}, {
		name:     "one service two ports",
		services: []*v1.Service{lbService("web", []v1.ServicePort{tcp(80), tcp(443)}, vip("192.168.100.10"))},
		want:     VIPPlan{Addrs: ips("192.168.100.10"), Listeners: aps("192.168.100.10:80", "192.168.100.10:443")},
	}, {
		name:     "pending: no ingress yet",
		services: []*v1.Service{lbService("web", []v1.ServicePort{tcp(80)})},
	}, {
		name:     "not a LoadBalancer",
		services: []*v1.Service{clusterIP},
	}, {
		name: "shared VIP with different ports, sorted and unique",
		services: []*v1.Service{
			lbService("b", []v1.ServicePort{tcp(8080), tcp(80)}, vip("192.168.100.11")),
			lbService("a", []v1.ServicePort{tcp(80)}, vip("192.168.100.11"), vip("192.168.100.2")),
		},
		want: VIPPlan{
			Addrs:     ips("192.168.100.2", "192.168.100.11"),
			Listeners: aps("192.168.100.2:80", "192.168.100.11:80", "192.168.100.11:8080"),
		},
	}, {
		name: "UDP and SCTP ports get the address but no listener",
		services: []*v1.Service{lbService("dns", []v1.ServicePort{
			{Port: 53, Protocol: v1.ProtocolUDP}, {Port: 9, Protocol: v1.ProtocolSCTP},
		}, vip("192.168.100.12"))},
		want: VIPPlan{Addrs: ips("192.168.100.12")},
	}, {
		name:     "empty protocol means TCP",
		services: []*v1.Service{lbService("web", []v1.ServicePort{{Port: 80}}, vip("192.168.100.13"))},
		want:     VIPPlan{Addrs: ips("192.168.100.13"), Listeners: aps("192.168.100.13:80")},
	}, {
		name: "ipMode Proxy is left to the load balancer, VIP is served",
		services: []*v1.Service{lbService("web", []v1.ServicePort{tcp(80)},
			v1.LoadBalancerIngress{IP: "192.168.100.14", IPMode: ptr.To(v1.LoadBalancerIPModeProxy)},
			v1.LoadBalancerIngress{IP: "192.168.100.15", IPMode: ptr.To(v1.LoadBalancerIPModeVIP)})},
		want: VIPPlan{Addrs: ips("192.168.100.15"), Listeners: aps("192.168.100.15:80")},
	}, {
		name: "hostname, garbage, loopback, unspecified and link-local ingress are ignored",
		services: []*v1.Service{lbService("web", []v1.ServicePort{tcp(80)},
			v1.LoadBalancerIngress{Hostname: "lb.example"}, vip("not-an-ip"), vip("127.0.0.5"),
			vip("0.0.0.0"), vip("169.254.1.1"), vip("fe80::1"))},
	}, {
		name:     "IPv6 and IPv4-mapped",
		services: []*v1.Service{lbService("web", []v1.ServicePort{tcp(80)}, vip("fd00::10"), vip("::ffff:192.168.100.16"))},
		want:     VIPPlan{Addrs: ips("192.168.100.16", "fd00::10"), Listeners: aps("192.168.100.16:80", "[fd00::10]:80")},
	}, {
		name:     "nil service",
		services: []*v1.Service{nil},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := PlanVIPs(tc.services)
			if !slices.Equal(got.Addrs, tc.want.Addrs) || !slices.Equal(got.Listeners, tc.want.Listeners) {
				t.Errorf("PlanVIPs = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestVIPPrefixes(t *testing.T) {
	got := VIPPrefixes(ips("192.168.100.10", "fd00::10"))
	if want := pfx("192.168.100.10/32", "fd00::10/128"); !slices.Equal(got, want) {
		t.Errorf("VIPPrefixes = %v, want %v", got, want)
	}
}

func TestNodePodCIDRs(t *testing.T) {
	tests := []struct {
		name string
		node *v1.Node
		want []string
	}{
		{"nil", nil, nil},
		{"none", &v1.Node{}, nil},
		{"legacy field", &v1.Node{Spec: v1.NodeSpec{PodCIDR: "10.244.1.0/24"}}, []string{"10.244.1.0/24"}},
		{"list wins", &v1.Node{Spec: v1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00:1::/64"}}},
			[]string{"10.244.1.0/24", "fd00:1::/64"}},
	}
	for _, tc := range tests {
		if got := NodePodCIDRs(tc.node); !slices.Equal(got, tc.want) {
			t.Errorf("%s: NodePodCIDRs = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestPodAddresses(t *testing.T) {
	tests := []struct {
		name  string
		cidrs []string
		want  []netip.Prefix
	}{
		{"none", nil, nil},
		{"IPv4 /24", []string{"10.244.1.0/24"}, pfx("10.244.1.1/24")},
		{"dual stack", []string{"fd00:10:244:1::/64", "10.244.1.0/24"}, pfx("10.244.1.1/24", "fd00:10:244:1::1/64")},
		{"not canonical", []string{"10.244.1.77/24"}, pfx("10.244.1.1/24")},
		{"/31 and /32 use the network address", []string{"10.0.0.4/31", "10.0.0.9/32"}, pfx("10.0.0.4/31", "10.0.0.9/32")},
		{"IPv6 /127 and /128", []string{"fd00::4/127", "fd00::9/128"}, pfx("fd00::4/127", "fd00::9/128")},
		{"/30", []string{"10.0.0.4/30"}, pfx("10.0.0.5/30")},
		{"garbage skipped", []string{"nope", "10.244.2.0/24"}, pfx("10.244.2.1/24")},
		{"duplicates", []string{"10.244.2.0/24", "10.244.2.0/24"}, pfx("10.244.2.1/24")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := PodAddresses(tc.cidrs); !slices.Equal(got, tc.want) {
				t.Errorf("PodAddresses(%v) = %v, want %v", tc.cidrs, got, tc.want)
			}
		})
	}
}

func TestAddrDiff(t *testing.T) {
	tests := []struct {
		name    string
		owned   func(netip.Prefix) bool
		current []netip.Prefix
		want    []netip.Prefix
		wantAdd []netip.Prefix
		wantDel []netip.Prefix
	}{{
		name:    "lo: add VIPs, keep loopback",
		owned:   OwnedOnLo,
		current: pfx("127.0.0.1/8", "::1/128"),
		want:    pfx("192.168.100.10/32", "192.168.100.11/32"),
		wantAdd: pfx("192.168.100.10/32", "192.168.100.11/32"),
	}, {
		name:    "lo: stale VIP removed, kept VIP untouched",
		owned:   OwnedOnLo,
		current: pfx("127.0.0.1/8", "192.168.100.10/32", "192.168.100.9/32", "::1/128"),
		want:    pfx("192.168.100.10/32"),
		wantDel: pfx("192.168.100.9/32"),
	}, {
		name:    "lo: nothing wanted, loopback stays",
		owned:   OwnedOnLo,
		current: pfx("127.0.0.1/8", "::1/128", "fd00::10/128"),
		wantDel: pfx("fd00::10/128"),
	}, {
		name:    "pod0: new CIDR replaces old, link-local stays",
		owned:   OwnedOnPod0,
		current: pfx("fe80::1c2b:3fff:fe4d:5e6f/64", "10.244.1.1/24"),
		want:    pfx("10.244.2.1/24"),
		wantAdd: pfx("10.244.2.1/24"),
		wantDel: pfx("10.244.1.1/24"),
	}, {
		name:    "pod0: prefix length changed",
		owned:   OwnedOnPod0,
		current: pfx("10.244.1.1/24"),
		want:    pfx("10.244.1.1/25"),
		wantAdd: pfx("10.244.1.1/25"),
		wantDel: pfx("10.244.1.1/24"),
	}, {
		name:    "in sync",
		owned:   OwnedOnPod0,
		current: pfx("10.244.1.1/24"),
		want:    pfx("10.244.1.1/24"),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			add, del := AddrDiff(tc.current, tc.want, tc.owned)
			if !slices.Equal(add, tc.wantAdd) || !slices.Equal(del, tc.wantDel) {
				t.Errorf("AddrDiff = add %v del %v, want add %v del %v", add, del, tc.wantAdd, tc.wantDel)
			}
		})
	}
}

func TestListenerDiff(t *testing.T) {
	start, stop := ListenerDiff(
		aps("192.168.100.10:80", "192.168.100.9:80", "192.168.100.10:443"),
		aps("192.168.100.10:443", "192.168.100.11:80", "192.168.100.10:80", "192.168.100.11:80"))
	if want := aps("192.168.100.11:80"); !slices.Equal(start, want) {
		t.Errorf("start = %v, want %v", start, want)
	}
	if want := aps("192.168.100.9:80"); !slices.Equal(stop, want) {
		t.Errorf("stop = %v, want %v", stop, want)
	}
}
