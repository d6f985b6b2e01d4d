package lab

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/labcloud/labcloud/lab/lan"
	"github.com/labcloud/labcloud/lab/libvirtd"
	"github.com/labcloud/labcloud/lb"
)

// IPFamily is the cluster's IP family (labcloud up --ip-family): which
// families its nodes, pods and Services get. The lab's network carries IPv4
// in every family (the guests' DHCPv4 lease, the host's view of them);
// ipv6 and dual add an IPv6 subnet with RA and DHCPv6.
type IPFamily string

const (
	IPv4 IPFamily = "ipv4"
	IPv6 IPFamily = "ipv6"
	// DualStack is IPv4 first: the primary family of Services and Nodes,
	// as kubeadm's dual-stack default is.
	DualStack IPFamily = "dual"
)

// IPFamilies are the values --ip-family takes.
var IPFamilies = []IPFamily{IPv4, IPv6, DualStack}

// ParseIPFamily reads --ip-family.
func ParseIPFamily(s string) (IPFamily, error) {
	switch f := IPFamily(s); f {
	case IPv4, IPv6, DualStack:
		return f, nil
	}
	if s == "" {
		s = `""`
	}
	return "", &FlagError{Flag: "--ip-family", Value: s, Reason: "want ipv4, ipv6 or dual"}
}

// orIPv4 reads a lab state written before the family was recorded.
func (f IPFamily) orIPv4() IPFamily {
	if f == "" {
		return IPv4
	}
	return f
}

// HasIPv6 says the cluster (and so the lab's network) has IPv6.
func (f IPFamily) HasIPv6() bool { return f.orIPv4() != IPv4 }

// The lab's IPv6 addresses, ULAs that echo the IPv4 ones: the bridge's
// /64, the DHCPv6 range (guest i is pinned to ::100+i by its DUID), the
// VIP pool, the pod range (a /64 per node) and the Service range.
const (
	Subnet6       = "fd00:10:123::/64"
	Gateway6      = "fd00:10:123::1"
	dhcp6First    = "fd00:10:123::100"
	dhcp6Last     = "fd00:10:123::1ff"
	VIPPool6      = "fd00:10:123::200-fd00:10:123::250"
	ClusterCIDR6  = "fd00:10:244::/56"
	ServiceCIDR   = "10.96.0.0/16"
	ServiceCIDR6  = "fd00:10:96::/112"
	ClusterDNS6   = "fd00:10:96::a" // kube-dns's IPv6 cluster IP (the tenth, as 10.96.0.10)
	NodeMaskSize6 = 64              // a node's IPv6 pod CIDR
)

// The lab's cluster DNS: kube-dns's IPv4 cluster IP (kubeadm's choice in
// 10.96.0.0/16) and the cluster's domain.
const (
	ClusterDNS    = "10.96.0.10"
	ClusterDomain = "cluster.local"
)

// Addressing is where the lab's IPv4 addresses are (up --subnet,
// --pod-cidr): resolved once from Options at up, recorded in State, and
// read from there by everything that works on the lab. Everything else is
// derived from the /24 (addresses .1, .100-.199, .200-.250, .254; the
// routed lab's segments, lan.Plan). The zero value, as a state written
// before it was recorded reads, is the defaults. The IPv6 prefixes and
// the Service ranges are fixed.
type Addressing struct {
	Subnet  netip.Prefix `json:"subnet"`  // the lab's network, a /24
	PodCIDR netip.Prefix `json:"podCIDR"` // the IPv4 cluster CIDR, a /16 or wider
}

// The defaults of up --subnet and --pod-cidr.
const (
	DefaultSubnet  = "10.123.0.0/24"
	DefaultPodCIDR = "10.244.0.0/16"
)

// The lab network's addresses: the bridge's, the DHCP range (one lease
// per guest), the VIP pool, and the router's on the LAN.
const (
	gatewayHost         = 1
	dhcpFirst, dhcpLast = 100, 199
	vipFirst, vipLast   = 200, 250
	routerHost          = 254
)

// Network is the lab's IPv4 network, a /24.
func (a Addressing) Network() netip.Prefix {
	if a.Subnet.IsValid() {
		return a.Subnet
	}
	return netip.MustParsePrefix(DefaultSubnet)
}

// ClusterCIDR is the IPv4 pods' range.
func (a Addressing) ClusterCIDR() string {
	if a.PodCIDR.IsValid() {
		return a.PodCIDR.String()
	}
	return DefaultPodCIDR
}

// Addr is address .i of the lab's network.
func (a Addressing) Addr(i int) netip.Addr {
	b := a.Network().Addr().As4()
	b[3] = byte(i)
	return netip.AddrFrom4(b)
}

// Gateway is the bridge's IPv4 address.
func (a Addressing) Gateway() string { return a.Addr(gatewayHost).String() }

// VIPPool is the load balancers' IPv4 pool, in the lab's network.
func (a Addressing) VIPPool() string {
	return a.Addr(vipFirst).String() + "-" + a.Addr(vipLast).String()
}

// RouterAddr is the LAN router's address on the lab's network.
func (a Addressing) RouterAddr() string { return a.Addr(routerHost).String() }

// octets are the network's first three, as libvirt's network takes it.
func (a Addressing) octets() string {
	s := a.Gateway()
	return s[:strings.LastIndexByte(s, '.')]
}

// lan is the routed lab's plan, derived from the network.
func (a Addressing) lan() lan.Plan { return lan.New(a.Network()) }

// Subnets are the bridge's subnets of family f: IPv4's always, IPv6's
// with IPv6.
func (a Addressing) Subnets(f IPFamily) []netip.Prefix {
	out := []netip.Prefix{a.Network()}
	if f.HasIPv6() {
		out = append(out, netip.MustParsePrefix(Subnet6))
	}
	return out
}

// Addresses are the lab's addresses for one family, primary family first
// in every list.
type Addresses struct {
	Addressing
	family IPFamily
	// apiAddress is the bridge address the API server listens on and
	// advertises: its family must be the Services' primary family.
	apiAddress   string
	gateways     []string // the bridge's addresses, as CoreDNS binds them
	clusterCIDRs []string
	serviceCIDRs []string
	clusterDNS   []string
	pools        []lb.PoolConfig
}

// Family is the cluster's IP family.
func (a Addresses) Family() IPFamily { return a.family }

// APIAddress is the bridge address the API server listens on.
func (a Addresses) APIAddress() string { return a.apiAddress }

// Gateways are the bridge's addresses.
func (a Addresses) Gateways() []string { return a.gateways }

// ClusterCIDRs are the pods' ranges.
func (a Addresses) ClusterCIDRs() []string { return a.clusterCIDRs }

// ServiceCIDRs are the Services' ranges.
func (a Addresses) ServiceCIDRs() []string { return a.serviceCIDRs }

// ClusterDNS are kube-dns's cluster IPs.
func (a Addresses) ClusterDNS() []string { return a.clusterDNS }

// Of is the lab's addresses for family f.
func (a Addressing) Of(f IPFamily) Addresses {
	f = f.orIPv4()
	v4 := Addresses{
		apiAddress: a.Gateway(), gateways: []string{a.Gateway()}, clusterCIDRs: []string{a.ClusterCIDR()},
		serviceCIDRs: []string{ServiceCIDR}, clusterDNS: []string{ClusterDNS},
		pools: []lb.PoolConfig{{Name: "lab", Addresses: []string{a.VIPPool()}}},
	}
	v6 := Addresses{
		apiAddress: Gateway6, gateways: []string{Gateway6}, clusterCIDRs: []string{ClusterCIDR6},
		serviceCIDRs: []string{ServiceCIDR6}, clusterDNS: []string{ClusterDNS6},
		pools: []lb.PoolConfig{{Name: "lab-ipv6", Addresses: []string{VIPPool6}}},
	}
	out := v4
	switch f {
	case IPv6:
		out = v6
	case DualStack:
		out = Addresses{
			apiAddress:   v4.apiAddress,
			gateways:     append(v4.gateways, v6.gateways...),
			clusterCIDRs: append(v4.clusterCIDRs, v6.clusterCIDRs...),
			serviceCIDRs: append(v4.serviceCIDRs, v6.serviceCIDRs...),
			clusterDNS:   append(v4.clusterDNS, v6.clusterDNS...),
			pools:        append(v4.pools, v6.pools...),
		}
	}
	out.Addressing, out.family = a, f
	return out
}

// APIServerURL is the API server as the nodes reach it.
func (a Addresses) APIServerURL() string {
	return fmt.Sprintf("https://%s", netip.AddrPortFrom(netip.MustParseAddr(a.apiAddress), APIPort))
}

// network is the lab's libvirt network.
func (a Addresses) network() libvirtd.Network {
	n := libvirtd.Network{Name: NetworkName, Bridge: Bridge, IPv4Prefix: a.octets(), DHCPFirst: dhcpFirst, DHCPLast: dhcpLast, DNS: a.Gateway()}
	if a.family.HasIPv6() {
		n.IPv6 = &libvirtd.IPv6Net{Address: Gateway6, Prefix: 64, DHCPFirst: dhcp6First, DHCPLast: dhcp6Last}
		for i := 1; i <= MaxNodes; i++ {
			n.IPv6.Hosts = append(n.IPv6.Hosts, libvirtd.IPv6Host{DUID: nodeDUID(i), IP: nodeIPv6(i)})
		}
	}
	return n
}

// nodeIPv6 is guest i's pinned IPv6 address: ::100+i in the bridge's /64.
func nodeIPv6(i int) string {
	a := netip.MustParseAddr(dhcp6First).As16()
	v := int(a[14])<<8 | int(a[15]) + i
	a[14], a[15] = byte(v>>8), byte(v)
	return netip.AddrFrom16(a).String()
}

// nodeDUID is the DHCPv6 client identifier guest i sends: a DUID-LL
// (type 3, hardware type 1) of its MAC, as the guest's dhcpcd is told to
// ("duid ll" in lab/image's dhcpcd.conf), so the pin in the network holds
// across reboots and leases lost.
func nodeDUID(i int) string {
	return "00:03:00:01:" + nodeMAC(i)
}
