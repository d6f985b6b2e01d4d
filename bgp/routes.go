package bgp

import (
	"fmt"
	"net/netip"
	"slices"
)

// Route is one prefix announced with one next hop.
type Route struct {
	Prefix  netip.Prefix
	NextHop netip.Addr
}

func (r Route) String() string { return r.Prefix.String() + " via " + r.NextHop.String() }

// check refuses what no peer could use: a next hop of another family
// than the prefix (there is no extended next-hop encoding here), or one
// that is not a unicast address.
func (r Route) check() error {
	switch {
	case !r.Prefix.IsValid():
		return fmt.Errorf("route %s: no prefix", r)
	case r.Prefix.Masked() != r.Prefix:
		return fmt.Errorf("route %s: prefix has host bits set", r)
	case !r.NextHop.IsGlobalUnicast():
		return fmt.Errorf("route %s: next hop must be a unicast address", r)
	case r.Prefix.Addr().Is4() != r.NextHop.Is4():
		return fmt.Errorf("route %s: prefix and next hop are of different families", r)
	}
	return nil
}

// routeDiff is what turns the announced set into the desired one: the
// routes to announce (new prefixes, or a prefix whose next hop changed:
// announcing it again replaces the old path at the peers) and the
// prefixes to withdraw.
type routeDiff struct {
	announce []Route
	withdraw []netip.Prefix
}

// diffRoutes compares the announced routes with the desired ones; a
// prefix is desired at most once (normalize first).
func diffRoutes(announced map[netip.Prefix]netip.Addr, desired []Route) routeDiff {
	var d routeDiff
	want := make(map[netip.Prefix]bool, len(desired))
	for _, r := range desired {
		want[r.Prefix] = true
		if hop, ok := announced[r.Prefix]; !ok || hop != r.NextHop {
			d.announce = append(d.announce, r)
		}
	}
	for p := range announced {
		if !want[p] {
			d.withdraw = append(d.withdraw, p)
		}
	}
	slices.SortFunc(d.withdraw, netip.Prefix.Compare)
	return d
}

// normalize checks each route and refuses a prefix given two next hops:
// one route per prefix is what a peer keeps from one speaker.
func normalize(routes []Route) ([]Route, error) {
	out := make([]Route, 0, len(routes))
	hops := make(map[netip.Prefix]netip.Addr, len(routes))
	for _, r := range routes {
		if err := r.check(); err != nil {
			return nil, err
		}
		if hop, dup := hops[r.Prefix]; dup {
			if hop != r.NextHop {
				return nil, fmt.Errorf("prefix %s given two next hops, %s and %s", r.Prefix, hop, r.NextHop)
			}
			continue
		}
		hops[r.Prefix] = r.NextHop
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Route) int { return a.Prefix.Compare(b.Prefix) })
	return out, nil
}
