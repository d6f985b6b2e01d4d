package provider

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Which pod CIDRs may be routed at all. A Node's spec.podCIDRs is whatever
// its creator wrote, and a route "<podCIDR> via <node> dev <bridge>" beats
// any shorter route on the host: a /1 takes half the Internet from the
// default route. So a pod CIDR is routed only when it lies inside the
// cluster CIDR (--cluster-cidr), touches no special-purpose range and no
// subnet connected to the host, is not the whole cluster CIDR, and no
// older Node's claim overlaps it. These are pure functions over values;
// routes.go does the I/O.

// specialPurpose are ranges no pod CIDR may overlap: traffic to them is
// never a pod's (RFC 6890 and its IPv6 counterparts).
var specialPurpose = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this network"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved, with the broadcast address"},
	{netip.MustParsePrefix("::/128"), "the unspecified address"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("::ffff:0:0/96"), "IPv4-mapped"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// ParseClusterCIDRs reads the value of --cluster-cidr as the upstream
// route controller does: comma-separated CIDRs, at most one per family,
// host bits ignored. Empty means none. It also refuses a cluster CIDR that
// overlaps a special-purpose range (such as 10.244.0.0/0, a typo for /16):
// no pod CIDR there could be routed. Errors name the flag and its value.
func ParseClusterCIDRs(value string) ([]netip.Prefix, error) {
	value = strings.TrimSpace(value)
	if value == "" {
		return nil, nil
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("--cluster-cidr=%q: %s", value, fmt.Sprintf(format, args...))
	}
	var out []netip.Prefix
	for _, s := range strings.Split(value, ",") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, bad("%q is not a CIDR (want e.g. 10.244.0.0/16, or an IPv4 and an IPv6 CIDR separated by a comma)", s)
		}
		p = p.Masked()
		for _, sp := range specialPurpose {
			if p.Overlaps(sp.prefix) {
				return nil, bad("%s overlaps %s (%s), which no pod CIDR may", p, sp.prefix, sp.what)
			}
		}
		if slices.ContainsFunc(out, func(q netip.Prefix) bool { return q.Addr().Is4() == p.Addr().Is4() }) {
			return nil, bad("more than one %s CIDR (at most one per family, as the route controller requires)", prefixFamily(p))
		}
		out = append(out, p)
	}
	return out, nil
}

// podCIDRRules are the facts, besides the Nodes, that decide whether a pod
// CIDR may be routed at all, whatever its next hop.
type podCIDRRules struct {
	cluster   []netip.Prefix // from --cluster-cidr
	connected []netip.Prefix // subnets of every address on the host's links
}

// refusal says why cidr (masked) must get no route whoever claims it, or
// "" when it may get one unless an older Node's claim overlaps it
// (podCIDRClaims).
func (r podCIDRRules) refusal(cidr netip.Prefix) string {
	if len(r.cluster) == 0 {
		return "no cluster CIDR to check it against: start the CCM with --cluster-cidr (the cluster's pod subnet)"
	}
	if cidr.Bits() == 0 {
		return "a default route, which would capture all traffic"
	}
	for _, sp := range specialPurpose {
		if cidr.Overlaps(sp.prefix) {
			return fmt.Sprintf("overlaps %s (%s), which is never pod traffic", sp.prefix, sp.what)
		}
	}
	if !slices.ContainsFunc(r.cluster, func(c netip.Prefix) bool { return prefixWithin(cidr, c) }) {
		same := prefixesOfFamily(r.cluster, cidr)
		if len(same) == 0 {
			return fmt.Sprintf("no %s cluster CIDR (--cluster-cidr=%s)", prefixFamily(cidr), joinPrefixes(r.cluster))
		}
		return fmt.Sprintf("not inside the cluster CIDR %s (--cluster-cidr)", joinPrefixes(same))
	}
	if slices.Contains(r.cluster, cidr) {
		return fmt.Sprintf("the whole cluster CIDR %s, every Node's pods", cidr)
	}
	for _, s := range r.connected {
		if cidr.Overlaps(s) {
			return fmt.Sprintf("overlaps %s, a subnet connected to this host", s)
		}
	}
	return ""
}

// podCIDRClaims are every Node's pod CIDRs judged at once (judge).
type podCIDRClaims struct {
	rules podCIDRRules
	why   map[nodeCIDR]string // each claim's refusal; "" when it is routed
	kept  []nodeCIDR          // the claims routed, oldest Node first
	// byAddr is kept's indices in address order (no two overlap): ints,
	// cheap to insert among.
	byAddr []int
}

// nodeCIDR is a Node's claim to a pod CIDR.
type nodeCIDR struct {
	node string
	cidr netip.Prefix
}

// judge decides every Node's pod CIDRs. A CIDR the rules refuse is refused
// and keeps nothing from anyone (a Node claiming the whole cluster CIDR
// must not starve the others). Of the rest, oldest Node first
// (firstClaimant), each is routed unless it overlaps one routed for
// another Node, whose it stays: a newcomer cannot take an address of a
// Node's pods, not even by claiming part of its CIDR. Every replica and
// every pass agree. O(n log n) for n claims: the route controller's
// CreateRoute judges every Node for each one.
func (r podCIDRRules) judge(nodes []*v1.Node) podCIDRClaims {
	c := podCIDRClaims{rules: r, why: make(map[nodeCIDR]string, len(nodes))}
	for _, n := range slices.SortedFunc(slices.Values(nodes), firstClaimant) {
		for _, cidr := range podCIDRsOf(n) {
			claim := nodeCIDR{node: n.Name, cidr: cidr}
			at, over := c.overlapping(cidr)
			why := c.rules.refusal(cidr)
			if why == "" {
				why = overlapRefusal(n.Name, cidr, over)
			}
			c.why[claim] = why
			if why == "" && len(over) == 0 {
				c.byAddr = slices.Insert(c.byAddr, at, len(c.kept))
				c.kept = append(c.kept, claim)
			}
		}
	}
	return c
}

// refusal says why node must get no route to cidr (masked), or "" when it
// may get one: as judged if node claims cidr, else as a claim younger than
// every other.
func (c podCIDRClaims) refusal(node string, cidr netip.Prefix) string {
	if why, judged := c.why[nodeCIDR{node: node, cidr: cidr}]; judged {
		return why
	}
	if why := c.rules.refusal(cidr); why != "" {
		return why
	}
	_, over := c.overlapping(cidr)
	return overlapRefusal(node, cidr, over)
}

// overlapRefusal says why node must get no route to cidr when the kept
// claims over overlap it, or "" when none is another Node's.
func overlapRefusal(node string, cidr netip.Prefix, over []nodeCIDR) string {
	for _, k := range over {
		switch {
		case k.node == node:
		case k.cidr == cidr:
			return fmt.Sprintf("also claimed by node %q, which keeps it (the oldest claiming Node, ties broken by name)", k.node)
		default:
			return fmt.Sprintf("overlaps %s of node %q, which keeps it (the oldest claiming Node, ties broken by name)", k.cidr, k.node)
		}
	}
	return ""
}

// overlapping are the kept claims that overlap cidr, and where in byAddr
// cidr would go: the one before it if that contains it, then those inside
// it, which follow it (no two kept overlap).
func (c podCIDRClaims) overlapping(cidr netip.Prefix) (at int, over []nodeCIDR) {
	at, _ = slices.BinarySearchFunc(c.byAddr, cidr.Addr(), func(i int, a netip.Addr) int { return c.kept[i].cidr.Addr().Compare(a) })
	if at > 0 && c.kept[c.byAddr[at-1]].cidr.Contains(cidr.Addr()) {
		over = append(over, c.kept[c.byAddr[at-1]])
	}
	for _, i := range c.byAddr[at:] {
		if !cidr.Contains(c.kept[i].cidr.Addr()) {
			break
		}
		over = append(over, c.kept[i])
	}
	return at, over
}

// prefixWithin reports whether p lies within c (same family, at least as long).
func prefixWithin(p, c netip.Prefix) bool {
	return c.Bits() <= p.Bits() && c.Contains(p.Addr())
}

// controllerDeletes reports whether the upstream route controller would
// delete an unwanted route to dst: it only touches routes whose first or
// last address is inside a cluster CIDR (isResponsibleForRoute).
func controllerDeletes(dst netip.Prefix, cluster []netip.Prefix) bool {
	first, last := dst.Masked().Addr(), lastAddr(dst)
	return slices.ContainsFunc(cluster, func(c netip.Prefix) bool { return c.Contains(first) || c.Contains(last) })
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// firstClaimant orders Nodes oldest first, by creationTimestamp (which the
// API server sets), ties broken by name: a newcomer cannot take a CIDR.
func firstClaimant(a, b *v1.Node) int {
	if c := a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time); c != 0 {
		return c
	}
	return cmp.Compare(a.Name, b.Name)
}

// podCIDRsOf are the Node's parseable pod CIDRs, masked, each once.
func podCIDRsOf(n *v1.Node) []netip.Prefix {
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	var out []netip.Prefix
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil && !slices.Contains(out, p.Masked()) {
			out = append(out, p.Masked())
		}
	}
	return out
}

func prefixesOfFamily(ps []netip.Prefix, p netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, q := range ps {
		if q.Addr().Is4() == p.Addr().Is4() {
			out = append(out, q)
		}
	}
	return out
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func prefixFamily(p netip.Prefix) string {
	if p.Addr().Is4() {
		return "IPv4"
	}
	return "IPv6"
}
