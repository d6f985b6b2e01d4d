package uplink

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// HostRoute is one of the host's routes as the clash check sees it.
type HostRoute struct {
	Prefix   netip.Prefix
	Dev      string
	Protocol netlink.RouteProtocol
}

func (r HostRoute) String() string {
	if r.Dev == "" {
		return r.Prefix.String()
	}
	return r.Prefix.String() + " dev " + r.Dev
}

// zeroconf is the link-local route some hosts keep (NetworkManager,
// avahi-autoipd): the transit's more specific route wins, and nothing
// lives on 169.254.123.0/30.
var zeroconf = netip.MustParsePrefix("169.254.0.0/16")

// Clashes are the lab's prefixes (and the transit) that overlap one of
// the host's routes, each naming both: the lab's routes would take the
// host's traffic to those addresses. The default route, the link-local
// IPv6 /64s and zeroconf's 169.254.0.0/16 clash with nothing, and the
// lab's own leftovers (Protocol, or on HostLink) are ignored.
func Clashes(lab []Named, host []HostRoute) []string {
	lab = append([]Named{{What: "uplink's transit", Prefix: Transit}}, lab...)
	var out []string
	for _, r := range host {
		p := r.Prefix.Masked()
		if p.Bits() == 0 || r.Protocol == Protocol || r.Dev == HostLink ||
			(p.Addr().Is6() && p.Addr().IsLinkLocalUnicast()) || p == zeroconf {
			continue
		}
		for _, n := range lab {
			if n.Prefix.Overlaps(p) {
				c := fmt.Sprintf("the lab's %s %s and the host's route %s overlap", n.What, n.Prefix, r)
				if n.Flag != "" {
					c += fmt.Sprintf(" (labcloud up %s moves the lab's)", n.Flag)
				}
				out = append(out, c)
			}
		}
	}
	return out
}

// ClashError is up's refusal: the clashes, and what to do.
type ClashError struct{ Clashes []string }

func (e *ClashError) Error() string {
	return strings.Join(e.Clashes, "; ") + ": move the lab's with the flag named, or remove or move the host's route (or bring the lab up on a host without it)"
}

// Check refuses, with a *ClashError, a plan whose prefixes overlap a route
// in ns's main table.
func Check(ns netns.NsHandle, p Plan) error {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in the host's namespace: %w", err)
	}
	defer h.Close()
	var host []HostRoute
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := h.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return fmt.Errorf("list the host's routes: %w", err)
		}
		for _, r := range rs {
			if r.Dst == nil { // a default route
				continue
			}
			a, _ := netip.AddrFromSlice(r.Dst.IP)
			bits, _ := r.Dst.Mask.Size()
			hr := HostRoute{Prefix: netip.PrefixFrom(a.Unmap(), bits), Protocol: r.Protocol}
			if l, err := h.LinkByIndex(r.LinkIndex); err == nil {
				hr.Dev = l.Attrs().Name
			}
			host = append(host, hr)
		}
	}
	if c := Clashes(p.Prefixes, host); len(c) > 0 {
		return &ClashError{Clashes: c}
	}
	return nil
}
