package netroutes

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }
func rt(dst, gw string) Route   { return Route{Dst: pfx(dst), Gateway: addr(gw)} }

func node(name string, cidrs []string, addrs ...string) Node {
	n := Node{Name: name}
	for _, c := range cidrs {
		n.PodCIDRs = append(n.PodCIDRs, pfx(c))
	}
	for _, a := range addrs {
		n.Addresses = append(n.Addresses, addr(a))
	}
	return n
}

func TestDesired(t *testing.T) {
	v4 := []netip.Prefix{pfx("192.168.122.1/24")}
	dual := []netip.Prefix{pfx("192.168.122.1/24"), pfx("fd00:122::1/64")}

	tests := []struct {
		name     string
		subnets  []netip.Prefix
		nodes    []Node
		want     []Route
		problems []string // substrings, one per expected problem, in order
	}{{
		name:    "one route per node via its bridge address",
		subnets: v4,
		nodes: []Node{
			node("b", []string{"10.244.2.0/24"}, "192.168.122.12"),
			node("a", []string{"10.244.1.0/24"}, "192.168.122.11"),
		},
		want: []Route{rt("10.244.1.0/24", "192.168.122.11"), rt("10.244.2.0/24", "192.168.122.12")},
	}, {
		name:    "first address on the bridge subnet wins, others ignored",
		subnets: v4,
		nodes:   []Node{node("a", []string{"10.244.1.0/24"}, "10.0.0.5", "192.168.122.11", "192.168.122.99")},
		want:    []Route{rt("10.244.1.0/24", "192.168.122.11")},
	}, {
		name:     "no address on the bridge subnet is a problem, not a route",
		subnets:  v4,
		nodes:    []Node{node("off", []string{"10.244.1.0/24"}, "10.0.0.5")},
		problems: []string{`node "off" pod CIDR 10.244.1.0/24: no IPv4 address on the bridge subnet(s) [192.168.122.1/24]`},
	}, {
		name:     "node without addresses",
		subnets:  v4,
		nodes:    []Node{node("bare", []string{"10.244.1.0/24"})},
		problems: []string{`"bare"`},
	}, {
		name:    "node without pod CIDRs is silently skipped",
		subnets: v4,
		nodes:   []Node{node("new", nil, "192.168.122.11")},
	}, {
		name:    "IPv4-mapped node address counts as IPv4",
		subnets: v4,
		nodes:   []Node{node("a", []string{"10.244.1.0/24"}, "::ffff:192.168.122.11")},
		want:    []Route{rt("10.244.1.0/24", "192.168.122.11")},
	}, {
		name:    "host bits in a pod CIDR are masked",
		subnets: v4,
		nodes:   []Node{node("a", []string{"10.244.1.7/24"}, "192.168.122.11")},
		want:    []Route{rt("10.244.1.0/24", "192.168.122.11")},
	}, {
		name:    "dual stack gets a route per family",
		subnets: dual,
		nodes:   []Node{node("a", []string{"fd10:244:1::/64", "10.244.1.0/24"}, "fd00:122::11", "192.168.122.11")},
		want:    []Route{rt("10.244.1.0/24", "192.168.122.11"), rt("fd10:244:1::/64", "fd00:122::11")},
	}, {
		name:     "IPv6 CIDR needs an IPv6 address on the bridge",
		subnets:  dual,
		nodes:    []Node{node("a", []string{"10.244.1.0/24", "fd10:244:1::/64"}, "192.168.122.11")},
		want:     []Route{rt("10.244.1.0/24", "192.168.122.11")},
		problems: []string{`node "a" pod CIDR fd10:244:1::/64: no IPv6 address on the bridge subnet(s) [fd00:122::1/64]`},
	}, {
		name:     "IPv6 CIDR on an IPv4-only bridge",
		subnets:  v4,
		nodes:    []Node{node("a", []string{"fd10:244:1::/64"}, "fd00:122::11")},
		problems: []string{"no IPv6 address on the bridge subnet(s) []"},
	}, {
		name:     "the subnet's network address is not a node address",
		subnets:  v4,
		nodes:    []Node{node("a", []string{"10.244.1.0/24"}, "192.168.122.0")},
		problems: []string{"no IPv4 address"},
	}, {
		name:    "two nodes claiming one CIDR get no route and two problems",
		subnets: v4,
		nodes: []Node{
			node("a", []string{"10.244.1.0/24"}, "192.168.122.11"),
			node("b", []string{"10.244.1.0/24"}, "192.168.122.12"),
			node("c", []string{"10.244.3.0/24"}, "192.168.122.13"),
		},
		want:     []Route{rt("10.244.3.0/24", "192.168.122.13")},
		problems: []string{`node "a" pod CIDR 10.244.1.0/24: claimed by several nodes [a b]`, `node "b"`},
	}, {
		name:    "a node listing its CIDR twice gets one route",
		subnets: v4,
		nodes:   []Node{node("a", []string{"10.244.1.0/24", "10.244.1.0/24"}, "192.168.122.11")},
		want:    []Route{rt("10.244.1.0/24", "192.168.122.11")},
	}, {
		name:     "pod CIDR overlapping the bridge subnet",
		subnets:  v4,
		nodes:    []Node{node("a", []string{"192.168.0.0/16"}, "192.168.122.11")},
		problems: []string{"overlaps the bridge subnet 192.168.122.1/24"},
	}, {
		name:     "invalid pod CIDR",
		subnets:  v4,
		nodes:    []Node{{Name: "a", PodCIDRs: []netip.Prefix{{}}, Addresses: []netip.Addr{addr("192.168.122.11")}}},
		problems: []string{`node "a": invalid pod CIDR`},
	}, {
		name:     "no bridge subnets at all",
		nodes:    []Node{node("a", []string{"10.244.1.0/24"}, "192.168.122.11")},
		problems: []string{"no IPv4 address on the bridge subnet(s) []"},
	}}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, problems := Desired(tt.subnets, tt.nodes)
			if !slices.Equal(got, tt.want) {
				t.Errorf("routes = %v, want %v", got, tt.want)
			}
			if len(problems) != len(tt.problems) {
				t.Fatalf("problems = %v, want %d matching %q", problems, len(tt.problems), tt.problems)
			}
			for i, p := range problems {
				if !strings.Contains(p.String(), tt.problems[i]) {
					t.Errorf("problem %d = %q, want it to contain %q", i, p, tt.problems[i])
				}
			}
		})
	}
}

func TestDiff(t *testing.T) {
	a := rt("10.244.1.0/24", "192.168.122.11")
	b := rt("10.244.2.0/24", "192.168.122.12")
	b2 := rt("10.244.2.0/24", "192.168.122.22")
	c6 := rt("fd10:244:3::/64", "fd00:122::13")

	tests := []struct {
		name             string
		desired, actual  []Route
		wantAdd, wantRem []Route
	}{
		{name: "empty"},
		{name: "from nothing", desired: []Route{c6, b, a}, wantAdd: []Route{a, b, c6}},
		{name: "converged", desired: []Route{a, b, c6}, actual: []Route{c6, a, b}},
		{name: "everything stale", actual: []Route{b, a}, wantRem: []Route{a, b}},
		{name: "gateway moved", desired: []Route{a, b2}, actual: []Route{a, b}, wantAdd: []Route{b2}, wantRem: []Route{b}},
		{name: "duplicates collapse", desired: []Route{a, a}, actual: []Route{b, b}, wantAdd: []Route{a}, wantRem: []Route{b}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			add, rem := Diff(tt.desired, tt.actual)
			if !slices.Equal(add, tt.wantAdd) || !slices.Equal(rem, tt.wantRem) {
				t.Errorf("Diff = add %v remove %v, want add %v remove %v", add, rem, tt.wantAdd, tt.wantRem)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		routes []Route
		want   string // substring of the error; "" means valid
	}{
		{name: "valid dual stack", routes: []Route{rt("10.244.1.0/24", "192.168.122.11"), rt("fd10::/64", "fd00::11")}},
		{name: "zero gateway", routes: []Route{{Dst: pfx("10.244.1.0/24")}}, want: "must both be set"},
		{name: "host bits", routes: []Route{rt("10.244.1.1/24", "192.168.122.11")}, want: "want 10.244.1.0/24"},
		{name: "mixed families", routes: []Route{rt("10.244.1.0/24", "fd00::11")}, want: "different families"},
		{name: "one dst two gateways", routes: []Route{rt("10.244.1.0/24", "192.168.122.11"), rt("10.244.1.0/24", "192.168.122.12")},
			want: "10.244.1.0/24 is also routed via 192.168.122.11"},
		{name: "exact duplicate is fine", routes: []Route{rt("10.244.1.0/24", "192.168.122.11"), rt("10.244.1.0/24", "192.168.122.11")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := validate(tt.routes)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("validate = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestSubnetsOf(t *testing.T) {
	ipnet := func(ip string, ones, bits int) *net.IPNet {
		return &net.IPNet{IP: net.ParseIP(ip), Mask: net.CIDRMask(ones, bits)}
	}
	got := subnetsOf([]*net.IPNet{
		ipnet("10.88.0.1", 24, 32),                                     // 16-byte IPv4, as net.ParseIP gives
		{IP: net.IPv4(10, 88, 0, 2).To4(), Mask: net.CIDRMask(24, 32)}, // same subnet
		ipnet("127.0.0.1", 8, 32),
		ipnet("fd00:88::1", 64, 128),
		ipnet("10.0.0.2", 32, 32), // a point-to-point peer
		nil,
	})
	want := []netip.Prefix{netip.MustParsePrefix("10.88.0.0/24"), netip.MustParsePrefix("127.0.0.0/8"),
		netip.MustParsePrefix("fd00:88::/64"), netip.MustParsePrefix("10.0.0.2/32")}
	if !slices.Equal(got, want) {
		t.Errorf("subnetsOf = %v, want %v", got, want)
	}
}
