package netroutes

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Conversions between Route and netlink.Route, and checks on both.

// toKernel is the one shape labcloud installs:
// <dst> via <gw> dev <bridge> proto <Protocol> metric <Metric> table <Table>.
func (m *Manager) toKernel(r Route, link netlink.Link) *netlink.Route {
	return &netlink.Route{
		LinkIndex: link.Attrs().Index,
		Dst:       ipNet(r.Dst),
		Gw:        r.Gateway.AsSlice(),
		Protocol:  m.cfg.Protocol,
		Table:     m.cfg.Table,
		Priority:  m.cfg.Metric,
		Type:      unix.RTN_UNICAST,
	}
}

// ipNet is p as netlink carries it.
func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// fromKernel reports whether an owned kernel route has exactly the shape
// toKernel produces on the current bridge. Kernel flags such as linkdown are
// state, not shape, and are ignored.
func (m *Manager) fromKernel(k netlink.Route, link netlink.Link) (Route, bool) {
	if k.LinkIndex != link.Attrs().Index || k.Priority != m.cfg.Metric || k.Tos != 0 ||
		k.Type != unix.RTN_UNICAST || len(k.MultiPath) != 0 || k.Src != nil {
		return Route{}, false
	}
	dst, ok := prefixFromIPNet(k.Dst)
	if !ok {
		return Route{}, false
	}
	gw, ok := netip.AddrFromSlice(k.Gw)
	if !ok {
		return Route{}, false
	}
	if dst.Addr().Is4() {
		gw = gw.Unmap()
	}
	r := Route{Dst: dst, Gateway: gw}
	return r, checkRoute(r) == nil
}

func sameDst(k netlink.Route, dst netip.Prefix) bool {
	p, ok := prefixFromIPNet(k.Dst)
	return ok && p == dst
}

func sameGateway(k netlink.Route, gw netip.Addr) bool {
	a, ok := netip.AddrFromSlice(k.Gw)
	return ok && a.Unmap() == gw.Unmap()
}

func prefixFromIPNet(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	addr, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, bits := n.Mask.Size()
	if bits == 32 {
		addr = addr.Unmap() // net.IP keeps IPv4 in 16 bytes at times
	}
	if bits != addr.BitLen() {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(addr, ones), true
}

// validate rejects routes the kernel would refuse or mangle, and two routes
// to one destination, which no single route table entry can honour.
func validate(routes []Route) error {
	var errs []error
	gw := make(map[netip.Prefix]netip.Addr, len(routes))
	for _, r := range routes {
		if err := checkRoute(r); err != nil {
			errs = append(errs, err)
			continue
		}
		if prev, ok := gw[r.Dst]; ok && prev != r.Gateway {
			errs = append(errs, fmt.Errorf("route %s: %s is also routed via %s", r, r.Dst, prev))
			continue
		}
		gw[r.Dst] = r.Gateway
	}
	return errors.Join(errs...)
}

func checkRoute(r Route) error {
	switch {
	case !r.Dst.IsValid() || !r.Gateway.IsValid():
		return fmt.Errorf("route %s: destination and gateway must both be set", r)
	case r.Dst != r.Dst.Masked():
		return fmt.Errorf("route %s: destination has host bits set (want %s)", r, r.Dst.Masked())
	case r.Dst.Addr().Is4() != r.Gateway.Is4():
		return fmt.Errorf("route %s: destination and gateway are of different families", r)
	}
	return nil
}
