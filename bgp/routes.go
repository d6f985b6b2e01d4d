package bgp

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
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

// normalize keeps one good route per prefix, sorted, and refuses only
// what is wrong: a route that fails its check, or a prefix given more than
// one next hop (one route per prefix is what a peer keeps from one
// speaker). A prefix in conflict keeps the next hop it is announced with
// (announced) if that is one of them, so a second claim can neither move
// nor withdraw it; otherwise it is not announced. refused says why, a line
// per route or prefix, in order.
func normalize(routes []Route, announced map[netip.Prefix]netip.Addr) (out []Route, refused []string) {
	good := make([]Route, 0, len(routes))
	for _, r := range routes {
		if err := r.check(); err != nil {
			refused = append(refused, err.Error())
			continue
		}
		good = append(good, r)
	}
	slices.SortFunc(good, func(a, b Route) int {
		if c := a.Prefix.Compare(b.Prefix); c != 0 {
			return c
		}
		return a.NextHop.Compare(b.NextHop)
	})
	good = slices.Compact(good)
	for i, j := 0, 0; i < len(good); i = j {
		p := good[i].Prefix
		for j = i + 1; j < len(good) && good[j].Prefix == p; j++ {
		}
		if j == i+1 {
			out = append(out, good[i])
			continue
		}
		hops := make([]string, 0, j-i)
		kept := false
		for _, r := range good[i:j] {
			hops = append(hops, r.NextHop.String())
			kept = kept || announced[p] == r.NextHop
		}
		why := fmt.Sprintf("prefix %s given next hops %s", p, strings.Join(hops, " and "))
		if kept {
			out = append(out, Route{p, announced[p]})
			refused = append(refused, why+": keeps "+announced[p].String()+" until one remains")
		} else {
			refused = append(refused, why+": not announced until one remains")
		}
	}
	return out, refused
}
