package lab

import (
	"fmt"
	"net/netip"

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

// Subnets are the bridge's subnets: IPv4's always, IPv6's with IPv6.
func (f IPFamily) Subnets() []netip.Prefix {
	out := []netip.Prefix{netip.MustParsePrefix(Subnet)}
	if f.HasIPv6() {
		out = append(out, netip.MustParsePrefix(Subnet6))
	}
	return out
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
	nodeMaskSize6 = 64
)

// addressing is what the lab's addresses are for one family, primary
// family first in every list.
type addressing struct {
	// apiAddress is the bridge address the API server listens on and
	// advertises: its family must be the Services' primary family.
	apiAddress   string
	gateways     []string // the bridge's addresses, as CoreDNS binds them
	clusterCIDRs []string
	serviceCIDRs []string
	clusterDNS   []string
	pools        []lb.PoolConfig
}

func (f IPFamily) addressing() addressing {
	v4 := addressing{
		apiAddress: Gateway, gateways: []string{Gateway}, clusterCIDRs: []string{ClusterCIDR},
		serviceCIDRs: []string{ServiceCIDR}, clusterDNS: []string{ClusterDNS},
		pools: []lb.PoolConfig{{Name: "lab", Addresses: []string{VIPPool}}},
	}
	v6 := addressing{
		apiAddress: Gateway6, gateways: []string{Gateway6}, clusterCIDRs: []string{ClusterCIDR6},
		serviceCIDRs: []string{ServiceCIDR6}, clusterDNS: []string{ClusterDNS6},
		pools: []lb.PoolConfig{{Name: "lab-ipv6", Addresses: []string{VIPPool6}}},
	}
	switch f.orIPv4() {
	case IPv6:
		return v6
	case DualStack:
		return addressing{
			apiAddress:   v4.apiAddress,
			gateways:     append(v4.gateways, v6.gateways...),
			clusterCIDRs: append(v4.clusterCIDRs, v6.clusterCIDRs...),
			serviceCIDRs: append(v4.serviceCIDRs, v6.serviceCIDRs...),
			clusterDNS:   append(v4.clusterDNS, v6.clusterDNS...),
			pools:        append(v4.pools, v6.pools...),
		}
	}
	return v4
}

// apiServerURL is the API server as the nodes reach it.
func (f IPFamily) apiServerURL() string {
	return fmt.Sprintf("https://%s", netip.AddrPortFrom(netip.MustParseAddr(f.addressing().apiAddress), APIPort))
}

// network is the lab's libvirt network for the family.
func (f IPFamily) network() libvirtd.Network {
	n := libvirtd.Network{Name: NetworkName, Bridge: Bridge, IPv4Prefix: subnet, DHCPFirst: dhcpFirst, DHCPLast: dhcpLast, DNS: Gateway}
	if f.HasIPv6() {
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
