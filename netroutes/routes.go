// Package netroutes programs pod-CIDR routes on the host's libvirt bridge:
// `<podCIDR> via <node address> dev <bridge> proto <labcloud>`.
//
// This file is the decision half: pure functions over values that say which
// routes should exist (Desired) and what to change to get there (Diff).
// manager.go applies the result with netlink.
package netroutes

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
)

// Route is one pod-CIDR route: traffic to Dst goes via Gateway on the bridge.
// Dst is always canonical (host bits zero); Dst and Gateway share a family.
type Route struct {
	Dst     netip.Prefix
	Gateway netip.Addr
}

func (r Route) String() string { return r.Dst.String() + " via " + r.Gateway.String() }

// Node is what the route decision needs to know about a Kubernetes node.
type Node struct {
	Name     string
	PodCIDRs []netip.Prefix
	// Addresses are the node's addresses (InternalIPs first); the first one
	// on a bridge subnet of the pod CIDR's family becomes the gateway.
	Addresses []netip.Addr
}

// Problem explains why a node's pod CIDR gets no route.
type Problem struct {
	Node    string
	PodCIDR netip.Prefix // invalid when the problem is not about one CIDR
	Reason  string
}

func (p Problem) String() string {
	if p.PodCIDR.IsValid() {
		return fmt.Sprintf("node %q pod CIDR %s: %s", p.Node, p.PodCIDR, p.Reason)
	}
	return fmt.Sprintf("node %q: %s", p.Node, p.Reason)
}

// Desired returns the routes that should exist for nodes, given the bridge's
// subnets, sorted. A pod CIDR is skipped with a Problem when it is invalid,
// overlaps a bridge subnet, is claimed by more than one node (routing it to
// either would be a guess), or when the node has no address on a bridge subnet
// of the CIDR's family. Nodes without pod CIDRs are not a problem: IPAM has
// simply not assigned one yet.
func Desired(subnets []netip.Prefix, nodes []Node) ([]Route, []Problem) {
	var problems []Problem
	claims := map[netip.Prefix][]string{} // dst -> claiming node names
	gateway := map[netip.Prefix]netip.Addr{}
	var order []netip.Prefix

	for _, n := range nodes {
		for _, cidr := range n.PodCIDRs {
			if !cidr.IsValid() {
				problems = append(problems, Problem{Node: n.Name, Reason: "invalid pod CIDR"})
				continue
			}
			cidr = cidr.Masked()
			if s, ok := overlapping(subnets, cidr); ok {
				problems = append(problems, Problem{Node: n.Name, PodCIDR: cidr, Reason: "overlaps the bridge subnet " + s.String()})
				continue
			}
			gw, ok := gatewayFor(subnets, n.Addresses, cidr)
			if !ok {
				reason := fmt.Sprintf("no %s address on the bridge subnet(s) %v", family(cidr.Addr()), sameFamily(subnets, cidr.Addr()))
				problems = append(problems, Problem{Node: n.Name, PodCIDR: cidr, Reason: reason})
				continue
			}
			if slices.Contains(claims[cidr], n.Name) {
				continue // the same node listing a CIDR twice
			}
			if len(claims[cidr]) == 0 {
				order = append(order, cidr)
			}
			claims[cidr] = append(claims[cidr], n.Name)
			gateway[cidr] = gw
		}
	}

	var routes []Route
	for _, dst := range order {
		names := claims[dst]
		if len(names) > 1 {
			for _, name := range names {
				problems = append(problems, Problem{Node: name, PodCIDR: dst, Reason: fmt.Sprintf("claimed by several nodes %v", names)})
			}
			continue
		}
		routes = append(routes, Route{Dst: dst, Gateway: gateway[dst]})
	}
	slices.SortFunc(routes, compareRoutes)
	return routes, problems
}

// Diff returns the routes to add and to remove so that actual becomes
// desired. Both results are sorted and free of duplicates.
func Diff(desired, actual []Route) (add, remove []Route) {
	want := make(map[Route]bool, len(desired))
	for _, r := range desired {
		want[r] = true
	}
	have := make(map[Route]bool, len(actual))
	for _, r := range actual {
		have[r] = true
	}
	for r := range want {
		if !have[r] {
			add = append(add, r)
		}
	}
	for r := range have {
		if !want[r] {
			remove = append(remove, r)
		}
	}
	slices.SortFunc(add, compareRoutes)
	slices.SortFunc(remove, compareRoutes)
	return add, remove
}

// gatewayFor picks the first node address of cidr's family that lies on one
// of the bridge subnets: only such an address is a usable next hop on the bridge.
func gatewayFor(subnets []netip.Prefix, addrs []netip.Addr, cidr netip.Prefix) (netip.Addr, bool) {
	for _, a := range addrs {
		a = a.Unmap() // an IPv4-mapped address is an IPv4 node address
		if !a.IsValid() || a.Is4() != cidr.Addr().Is4() {
			continue
		}
		for _, s := range subnets {
			if s.Contains(a) && a != s.Masked().Addr() {
				return a, true
			}
		}
	}
	return netip.Addr{}, false
}

func overlapping(subnets []netip.Prefix, cidr netip.Prefix) (netip.Prefix, bool) {
	for _, s := range subnets {
		if s.Overlaps(cidr) {
			return s, true
		}
	}
	return netip.Prefix{}, false
}

func sameFamily(subnets []netip.Prefix, a netip.Addr) []netip.Prefix {
	out := []netip.Prefix{}
	for _, s := range subnets {
		if s.Addr().Is4() == a.Is4() {
			out = append(out, s)
		}
	}
	return out
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// compareRoutes orders IPv4 before IPv6, then by destination, then gateway.
func compareRoutes(a, b Route) int {
	if c := a.Dst.Addr().Compare(b.Dst.Addr()); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Dst.Bits(), b.Dst.Bits()); c != 0 {
		return c
	}
	return a.Gateway.Compare(b.Gateway)
}
