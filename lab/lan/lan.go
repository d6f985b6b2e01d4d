// Package lan plans the LAN between the lab's hypervisor hosts when they
// are on separate segments (labcloud up --routed): each host's bridge is a
// subnet of its own that the host routes, and the hosts reach each other
// and the router over uplinks on a LAN of their own. The router learns
// the pod CIDRs and VIPs over BGP, each via its node, and reaches the
// nodes through static routes to the hosts' subnets.
package lan

import "fmt"

const (
	prefix = "10.123.250"
	// RouterAddr is the router's address on the LAN.
	RouterAddr = prefix + ".254"
	// VIPPool is the VIPs' range: on no host's segment, so reached
	// through the router only.
	VIPPool = "10.123.240.1-10.123.240.62"
	// viaRouter is what a host sends to the router: the other hosts'
	// subnets and the VIPs (its own subnet is connected, more specific).
	viaRouter = "10.123.0.0/16"
)

// Subnet is the first three octets of host k's guest subnet; the first
// host keeps first, the lab's own.
func Subnet(k int, first string) string {
	if k == 1 {
		return first
	}
	return fmt.Sprintf("10.123.%d", k)
}

// Uplink is host k's address on the LAN.
func Uplink(k int) string { return fmt.Sprintf("%s.%d", prefix, k) }

// HostCommands make host k route between its bridge and the LAN through
// its uplink interface, sending the other hosts' subnets, the VIPs and
// the pod CIDRs (clusterCIDR) to the router. Each is a command line to
// run in the host's network namespace. libvirt's firewall on a network in
// route mode rejects forwarding to the bridge for any address outside the
// network's subnet, pod CIDRs and VIPs included: the bridge's traffic is
// accepted ahead of its chains.
func HostCommands(k int, uplink, bridge, clusterCIDR string) [][]string {
	return [][]string{
		{"ip", "addr", "add", Uplink(k) + "/24", "dev", uplink},
		{"ip", "link", "set", uplink, "up"},
		{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"ip", "route", "replace", viaRouter, "via", RouterAddr},
		{"ip", "route", "replace", clusterCIDR, "via", RouterAddr},
		{"iptables", "-I", "FORWARD", "1", "-o", bridge, "-j", "ACCEPT"},
		{"iptables", "-I", "FORWARD", "1", "-i", bridge, "-j", "ACCEPT"},
	}
}

// RouterRoutes are the router's routes to each of the hosts' subnets
// (first: the first host's) via the host: ip(8) argument lists.
func RouterRoutes(hosts int, first string) [][]string {
	out := make([][]string, 0, hosts)
	for k := 1; k <= hosts; k++ {
		out = append(out, []string{"route", "replace", Subnet(k, first) + ".0/24", "via", Uplink(k)})
	}
	return out
}
