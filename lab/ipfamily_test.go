package lab

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"
)

func TestParseIPFamily(t *testing.T) {
	for _, s := range []string{"ipv4", "ipv6", "dual"} {
		if f, err := ParseIPFamily(s); err != nil || string(f) != s {
			t.Errorf("ParseIPFamily(%q) = %q, %v", s, f, err)
		}
	}
	for _, s := range []string{"", "IPv6", "v6", "dual-stack", "ipv4,ipv6"} {
		_, err := ParseIPFamily(s)
		var fe *FlagError
		if !errors.As(err, &fe) || fe.Flag != "--ip-family" || !strings.Contains(err.Error(), "ipv4, ipv6 or dual") {
			t.Errorf("ParseIPFamily(%q) = %v, want a --ip-family error", s, err)
		}
	}
	if IPFamily("").orIPv4() != IPv4 || IPFamily("").HasIPv6() {
		t.Error("a state without a family must read as IPv4")
	}
}

// What each family gives the cluster: the primary family first in every
// list, and the API server on the primary family's bridge address.
func TestAddressingPerFamily(t *testing.T) {
	for _, tc := range []struct {
		f                     IPFamily
		api                   string
		cluster, service, dns []string
		gateways, pools       []string
		apiURL                string
	}{
		{IPv4, Gateway, []string{"10.244.0.0/16"}, []string{"10.96.0.0/16"}, []string{"10.96.0.10"},
			[]string{Gateway}, []string{VIPPool}, "https://10.123.0.1:6443"},
		{IPv6, Gateway6, []string{"fd00:10:244::/56"}, []string{"fd00:10:96::/112"}, []string{"fd00:10:96::a"},
			[]string{Gateway6}, []string{VIPPool6}, "https://[fd00:10:123::1]:6443"},
		{DualStack, Gateway, []string{"10.244.0.0/16", "fd00:10:244::/56"}, []string{"10.96.0.0/16", "fd00:10:96::/112"},
			[]string{"10.96.0.10", "fd00:10:96::a"}, []string{Gateway, Gateway6}, []string{VIPPool, VIPPool6}, "https://10.123.0.1:6443"},
	} {
		t.Run(string(tc.f), func(t *testing.T) {
			a := defaults.Of(tc.f)
			var pools []string
			for _, p := range a.pools {
				pools = append(pools, p.Addresses...)
			}
			if a.apiAddress != tc.api || !slices.Equal(a.clusterCIDRs, tc.cluster) || !slices.Equal(a.serviceCIDRs, tc.service) ||
				!slices.Equal(a.clusterDNS, tc.dns) || !slices.Equal(a.gateways, tc.gateways) || !slices.Equal(pools, tc.pools) {
				t.Errorf("addressing = %+v", a)
			}
			if got := defaults.Of(tc.f).APIServerURL(); got != tc.apiURL {
				t.Errorf("API server URL %s, want %s", got, tc.apiURL)
			}
			// Every DNS address is in its Service range, every pool in the
			// bridge's subnet of its family.
			for i, d := range a.clusterDNS {
				if !netip.MustParsePrefix(a.serviceCIDRs[i]).Contains(netip.MustParseAddr(d)) {
					t.Errorf("cluster DNS %s outside %s", d, a.serviceCIDRs[i])
				}
			}
			for _, p := range pools {
				first := netip.MustParseAddr(strings.Split(p, "-")[0])
				if !netip.MustParsePrefix(Subnet).Contains(first) && !netip.MustParsePrefix(Subnet6).Contains(first) {
					t.Errorf("pool %s outside the bridge's subnets", p)
				}
			}
		})
	}
}

func TestNodeIPv6(t *testing.T) {
	for i, want := range map[int]string{1: "fd00:10:123::101", 2: "fd00:10:123::102", 15: "fd00:10:123::10f", MaxNodes: "fd00:10:123::164"} {
		if got := nodeIPv6(i); got != want {
			t.Errorf("nodeIPv6(%d) = %s, want %s", i, got, want)
		}
		a := netip.MustParseAddr(nodeIPv6(i))
		if a.Less(netip.MustParseAddr(dhcp6First)) || netip.MustParseAddr(dhcp6Last).Less(a) {
			t.Errorf("node %d's %s outside the DHCPv6 range", i, a)
		}
	}
	if got := nodeDUID(1); got != "00:03:00:01:52:54:00:7c:00:01" {
		t.Errorf("nodeDUID(1) = %s", got)
	}
}

// The lab's network for each family, read back as libvirt reads it.
func TestNetworkXMLPerFamily(t *testing.T) {
	for _, f := range IPFamilies {
		t.Run(string(f), func(t *testing.T) {
			x, err := defaults.Of(f).network().XML()
			if err != nil {
				t.Fatal(err)
			}
			var n libvirtxml.Network
			if err := n.Unmarshal(x); err != nil {
				t.Fatalf("%v\n%s", err, x)
			}
			if n.Name != NetworkName || n.Bridge == nil || n.Bridge.Name != Bridge || n.Forward == nil || n.Forward.Mode != "route" ||
				n.DNS == nil || n.DNS.Enable != "no" {
				t.Errorf("network %s", x)
			}
			want := 1
			if f.HasIPv6() {
				want = 2
			}
			if len(n.IPs) != want {
				t.Fatalf("%d <ip> elements, want %d:\n%s", len(n.IPs), want, x)
			}
			v4 := n.IPs[0]
			if v4.Family != "" || v4.Address != Gateway || v4.Netmask != "255.255.255.0" || v4.DHCP == nil ||
				v4.DHCP.Ranges[0].Start != "10.123.0.100" || v4.DHCP.Ranges[0].End != "10.123.0.199" {
				t.Errorf("IPv4 <ip> %+v", v4)
			}
			if n.DnsmasqOptions == nil || !slices.ContainsFunc(n.DnsmasqOptions.Option, func(o libvirtxml.NetworkDnsmasqOption) bool { return o.Value == "no-ping" }) {
				t.Errorf("dnsmasq pings an address before leasing it from the range (no no-ping option):\n%s", x)
			}
			if !f.HasIPv6() {
				return
			}
			v6 := n.IPs[1]
			if v6.Family != "ipv6" || v6.Address != Gateway6 || v6.Prefix != 64 || v6.DHCP == nil ||
				v6.DHCP.Ranges[0].Start != dhcp6First || v6.DHCP.Ranges[0].End != dhcp6Last {
				t.Errorf("IPv6 <ip> %+v", v6)
			}
			if len(v6.DHCP.Hosts) != MaxNodes || v6.DHCP.Hosts[0].ID != nodeDUID(1) || v6.DHCP.Hosts[0].IP != nodeIPv6(1) {
				t.Errorf("IPv6 hosts: %d, first %+v", len(v6.DHCP.Hosts), v6.DHCP.Hosts[0])
			}
		})
	}
}

// The CCM runs as shipped but with the lab's pod ranges: it routes only
// pod CIDRs inside --cluster-cidr.
func TestCCMClusterCIDRPerFamily(t *testing.T) {
	shipped := []string{"--cloud-provider=libvirt", "--allocate-node-cidrs=true", "--cluster-cidr=10.244.0.0/16", "--configure-cloud-routes=true"}
	for f, want := range map[IPFamily]string{IPv4: "10.244.0.0/16", IPv6: "fd00:10:244::/56", DualStack: "10.244.0.0/16,fd00:10:244::/56"} {
		got := withClusterCIDR(shipped, strings.Join(defaults.Of(f).clusterCIDRs, ","))
		if len(got) != len(shipped) || got[2] != "--cluster-cidr="+want || got[0] != shipped[0] || got[3] != shipped[3] {
			t.Errorf("%s: %v", f, got)
		}
	}
	if shipped[2] != "--cluster-cidr=10.244.0.0/16" {
		t.Error("withClusterCIDR changed its argument")
	}
}

// Everything derives from the addressing up resolves from --subnet and
// --pod-cidr: a moved lab has every address moved, a state written before
// (zero) has the defaults.
func TestAddressingMoved(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		// gateway, DHCP range, VIP pool, router, pod CIDR, host 2's routed
		// segment, its uplink, the routed VIP pool
		want []string
	}{
		{"a state written before", Options{}, []string{"10.123.0.1", "10.123.0.100-10.123.0.199", "10.123.0.200-10.123.0.250", "10.123.0.254",
			"10.244.0.0/16", "10.123.2.1", "10.123.250.2", "10.123.240.1-10.123.240.62"}},
		{"moved", Options{Subnet: "10.77.0.0/24", PodCIDR: "10.78.0.0/16"}, []string{"10.77.0.1", "10.77.0.100-10.77.0.199", "10.77.0.200-10.77.0.250", "10.77.0.254",
			"10.78.0.0/16", "10.77.2.1", "10.77.250.2", "10.77.240.1-10.77.240.62"}},
		{"moved off .0", Options{Subnet: "192.168.9.0/24", PodCIDR: "172.16.0.0/12"}, []string{"192.168.9.1", "192.168.9.100-192.168.9.199", "192.168.9.200-192.168.9.250", "192.168.9.254",
			"172.16.0.0/12", "192.168.2.1", "192.168.250.2", "192.168.240.1-192.168.240.62"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.opts.addressing()
			if tc.opts.Subnet == "" {
				a = Addressing{}
			}
			x, err := a.Of(IPv4).network().XML()
			if err != nil {
				t.Fatal(err)
			}
			var n libvirtxml.Network
			if err := n.Unmarshal(x); err != nil {
				t.Fatal(err)
			}
			hosts := labHosts("/tmp/lab", 2, a)
			routeHosts(hosts, a)
			cfg := labCloudConfig(a.Of(IPv4), true, hosts, hosts[1])
			got := []string{n.IPs[0].Address, n.IPs[0].DHCP.Ranges[0].Start + "-" + n.IPs[0].DHCP.Ranges[0].End,
				a.Of(IPv4).pools[0].Addresses[0], a.RouterAddr(), a.Of(IPv4).clusterCIDRs[0],
				hosts[1].Address, hosts[1].Uplink, cfg.LoadBalancer.Pools[0].Addresses[0]}
			if !slices.Equal(got, tc.want) {
				t.Errorf("resolved\n got %q\nwant %q", got, tc.want)
			}
			if st := (&State{IPFamily: IPv4, Addressing: a}); st.LabHosts()[0].Address != tc.want[0] {
				t.Errorf("a running lab's host is on %s, want %s", st.LabHosts()[0].Address, tc.want[0])
			}
		})
	}
}
