// Package lan plans the LAN between the lab's hypervisor hosts when they
// are on separate segments (labcloud up --routed): each host's bridge is a
// subnet of its own that the host routes, and the hosts reach each other
// and the router over uplinks on a LAN of their own. The router learns
// the pod CIDRs and VIPs over BGP, each via its node, and reaches the
// nodes through static routes to the hosts' subnets.
package lan

import (
	"fmt"
	"net/netip"
)

// Plan is the routed lab's addresses, all in the /16 of the first host's
// network A.B.C.0/24: host k's network (k > 1) is A.B.k.0/24, the LAN
// A.B.250.0/24 with the router at .254, the VIPs A.B.240.1-62 (on no
// host's segment, so reached through the router only).
type Plan struct{ first netip.Prefix }

// New is the plan around the first host's network, a /24.
func New(first netip.Prefix) Plan { return Plan{first: first} }

const (
	lanOctet = 250
	vipOctet = 240
)

// octets are the first two octets of the plan's /16 and third.
func (p Plan) octets(third int) string {
	b := p.first.Addr().As4()
	return fmt.Sprintf("%d.%d.%d", b[0], b[1], third)
}

func (p Plan) at(third, fourth int) string { return fmt.Sprintf("%s.%d", p.octets(third), fourth) }

// Subnet is the first three octets of host k's guest subnet; the first
// host keeps the lab's own.
func (p Plan) Subnet(k int) string {
	third := k
	if k == 1 {
		third = int(p.first.Addr().As4()[2])
	}
	return p.octets(third)
}

// Uplink is host k's address on the LAN.
func (p Plan) Uplink(k int) string { return p.at(lanOctet, k) }

// RouterAddr is the router's address on the LAN.
func (p Plan) RouterAddr() string { return p.Uplink(254) }

// VIPPool is the VIPs' range.
func (p Plan) VIPPool() string { return p.at(vipOctet, 1) + "-" + p.at(vipOctet, 62) }

// viaRouter is what a host sends to the router: the other hosts' subnets
// and the VIPs (its own subnet is connected, more specific).
func (p Plan) viaRouter() string { return p.at(0, 0) + "/16" }

// HostCommands make host k route between its bridge and the LAN through
// its uplink interface, sending the other hosts' subnets, the VIPs and
// the pod CIDRs (clusterCIDR) to the router. Each is a command line to
// run in the host's network namespace. libvirt's firewall on a network in
// route mode rejects forwarding to the bridge for any address outside the
// network's subnet, pod CIDRs and VIPs included: the bridge's traffic is
// accepted ahead of its chains.
func (p Plan) HostCommands(k int, uplink, bridge, clusterCIDR string) [][]string {
	return [][]string{
		{"ip", "addr", "add", p.Uplink(k) + "/24", "dev", uplink},
		{"ip", "link", "set", uplink, "up"},
		{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"ip", "route", "replace", p.viaRouter(), "via", p.RouterAddr()},
		{"ip", "route", "replace", clusterCIDR, "via", p.RouterAddr()},
		{"iptables", "-I", "FORWARD", "1", "-o", bridge, "-j", "ACCEPT"},
		{"iptables", "-I", "FORWARD", "1", "-i", bridge, "-j", "ACCEPT"},
	}
}

// RouterRoutes are the router's routes to each of the hosts' subnets
// (first: the first host's) via the host: ip(8) argument lists.
func (p Plan) RouterRoutes(hosts int) [][]string {
	out := make([][]string, 0, hosts)
	for k := 1; k <= hosts; k++ {
		out = append(out, []string{"route", "replace", p.Subnet(k) + ".0/24", "via", p.Uplink(k)})
	}
	return out
}
