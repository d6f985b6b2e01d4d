package nodeagent

import (
	"cmp"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
)

// VIPPlan is what the node serves for LoadBalancer Services: every VIP as a
// host address on lo, and an HTTP listener on every VIP and TCP port.
type VIPPlan struct {
	// Addrs are the ingress IPs, sorted and unique.
	Addrs []netip.Addr
	// Listeners are the VIP:port pairs to serve HTTP on, sorted and unique.
	Listeners []netip.AddrPort
}

// PlanVIPs decides which VIPs and ports to serve, the way kube-proxy treats
// LoadBalancer ingress IPs: only Services of type LoadBalancer, only ingress
// entries with an IP whose ipMode is unset or VIP (ipMode Proxy means the load
// balancer forwards to node ports and the node must not capture the VIP), and
// only TCP ports. A VIP whose Service has no TCP port is still put on lo, so
// it answers ping.
func PlanVIPs(services []*v1.Service) VIPPlan {
	addrs := map[netip.Addr]bool{}
	listeners := map[netip.AddrPort]bool{}
	for _, svc := range services {
		if svc == nil || svc.Spec.Type != v1.ServiceTypeLoadBalancer {
			continue
		}
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			if ing.IPMode != nil && *ing.IPMode != v1.LoadBalancerIPModeVIP {
				continue
			}
			a, ok := vipAddr(ing.IP)
			if !ok {
				continue
			}
			addrs[a] = true
			for _, p := range svc.Spec.Ports {
				if p.Protocol != "" && p.Protocol != v1.ProtocolTCP {
					continue
				}
				if p.Port <= 0 || p.Port > 65535 {
					continue
				}
				listeners[netip.AddrPortFrom(a, uint16(p.Port))] = true
			}
		}
	}
	plan := VIPPlan{}
	for a := range addrs {
		plan.Addrs = append(plan.Addrs, a)
	}
	for l := range listeners {
		plan.Listeners = append(plan.Listeners, l)
	}
	slices.SortFunc(plan.Addrs, netip.Addr.Compare)
	slices.SortFunc(plan.Listeners, netip.AddrPort.Compare)
	return plan
}

// vipAddr parses an ingress IP and rejects what cannot be a VIP.
func vipAddr(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	a = a.Unmap()
	if a.Zone() != "" || !a.IsGlobalUnicast() {
		return netip.Addr{}, false
	}
	return a, true
}

// VIPPrefixes turns VIPs into host prefixes (/32, /128) for lo.
func VIPPrefixes(addrs []netip.Addr) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out
}

// NodePodCIDRs returns a Node's pod CIDRs: spec.podCIDRs, or the legacy
// spec.podCIDR when the list is empty.
func NodePodCIDRs(node *v1.Node) []string {
	if node == nil {
		return nil
	}
	if len(node.Spec.PodCIDRs) > 0 {
		return node.Spec.PodCIDRs
	}
	if node.Spec.PodCIDR != "" {
		return []string{node.Spec.PodCIDR}
	}
	return nil
}

// PodAddresses decides the "pod addresses" for pod0: the first host address
// of each pod CIDR, with the CIDR's prefix length (as a CNI bridge would
// carry it). For /31 and /32 (IPv6 /127, /128) the first address is the
// network address itself. Unparsable CIDRs are skipped. The result is sorted
// and unique.
func PodAddresses(cidrs []string) []netip.Prefix {
	seen := map[netip.Prefix]bool{}
	var out []netip.Prefix
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			continue
		}
		p = p.Masked()
		a := p.Addr()
		if a.Is4In6() {
			continue
		}
		if p.Bits() < a.BitLen()-1 {
			a = a.Next()
		}
		q := netip.PrefixFrom(a, p.Bits())
		if !seen[q] {
			seen[q] = true
			out = append(out, q)
		}
	}
	slices.SortFunc(out, comparePrefix)
	return out
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}

// OwnedOnPod0 says which addresses on pod0 lab-node manages: all but the
// IPv6 link-local address the kernel gives every interface.
func OwnedOnPod0(p netip.Prefix) bool { return !p.Addr().IsLinkLocalUnicast() }

// OwnedOnLo says which addresses on lo lab-node manages: all but loopback
// addresses. In a lab guest nothing else puts addresses on lo, so VIPs left
// over from a previous run are found and removed.
func OwnedOnLo(p netip.Prefix) bool { return !p.Addr().IsLoopback() }

// AddrDiff compares an interface's current addresses with the wanted ones.
// Only addresses for which owned returns true are ever deleted. An address
// present with another prefix length is deleted and added again.
func AddrDiff(current, want []netip.Prefix, owned func(netip.Prefix) bool) (add, del []netip.Prefix) {
	wantSet := map[netip.Prefix]bool{}
	for _, p := range want {
		wantSet[p] = true
	}
	have := map[netip.Prefix]bool{}
	for _, p := range current {
		have[p] = true
		if !wantSet[p] && owned(p) {
			del = append(del, p)
		}
	}
	for p := range wantSet {
		if !have[p] {
			add = append(add, p)
		}
	}
	slices.SortFunc(add, comparePrefix)
	slices.SortFunc(del, comparePrefix)
	return add, del
}

// ListenerDiff compares running listeners with wanted ones.
func ListenerDiff(current, want []netip.AddrPort) (start, stop []netip.AddrPort) {
	wantSet := map[netip.AddrPort]bool{}
	for _, l := range want {
		wantSet[l] = true
	}
	have := map[netip.AddrPort]bool{}
	for _, l := range current {
		have[l] = true
		if !wantSet[l] {
			stop = append(stop, l)
		}
	}
	for l := range wantSet {
		if !have[l] {
			start = append(start, l)
		}
	}
	slices.SortFunc(start, netip.AddrPort.Compare)
	slices.SortFunc(stop, netip.AddrPort.Compare)
	return start, stop
}
