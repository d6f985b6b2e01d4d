package nodeagent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NetlinkInterfaces implements Interfaces with a netlink handle.
type NetlinkInterfaces struct {
	h *netlink.Handle
}

var _ Interfaces = (*NetlinkInterfaces)(nil)

// NewNetlinkInterfaces opens a route netlink handle in the current network
// namespace. Close releases it. (Only NETLINK_ROUTE: a handle for every
// family fails on kernels without xfrm_user loaded.)
func NewNetlinkInterfaces() (*NetlinkInterfaces, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink handle: %w", err)
	}
	return &NetlinkInterfaces{h: h}, nil
}

// NewNetlinkInterfacesWith wraps an existing handle, for example one opened
// in another network namespace with netlink.NewHandleAt.
func NewNetlinkInterfacesWith(h *netlink.Handle) *NetlinkInterfaces {
	return &NetlinkInterfaces{h: h}
}

// Close releases the handle.
func (n *NetlinkInterfaces) Close() { n.h.Close() }

// EnsureDummy implements Interfaces.
func (n *NetlinkInterfaces) EnsureDummy(name string) error {
	link, err := n.h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return fmt.Errorf("look up %s: %w", name, err)
		}
		if err := n.h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
			return fmt.Errorf("create dummy interface %s: %w", name, err)
		}
		if link, err = n.h.LinkByName(name); err != nil {
			return fmt.Errorf("look up %s: %w", name, err)
		}
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := n.h.LinkSetUp(link); err != nil {
			return fmt.Errorf("set %s up: %w", name, err)
		}
	}
	return nil
}

// Addrs implements Interfaces.
func (n *NetlinkInterfaces) Addrs(ifname string) ([]netip.Prefix, error) {
	link, err := n.h.LinkByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", ifname, err)
	}
	var addrs []netlink.Addr
	for range 3 { // a dump interrupted by a concurrent change is retried
		addrs, err = n.h.AddrList(link, netlink.FAMILY_ALL)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("list addresses of %s: %w", ifname, err)
	}
	out := make([]netip.Prefix, 0, len(addrs))
	for _, a := range addrs {
		p, ok := toPrefix(a.IPNet)
		if ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// AddAddr implements Interfaces.
func (n *NetlinkInterfaces) AddAddr(ifname string, p netip.Prefix) error {
	link, err := n.h.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("look up %s: %w", ifname, err)
	}
	if err := n.h.AddrReplace(link, &netlink.Addr{IPNet: toIPNet(p)}); err != nil {
		return fmt.Errorf("add %s to %s: %w", p, ifname, err)
	}
	return nil
}

// DelAddr implements Interfaces.
func (n *NetlinkInterfaces) DelAddr(ifname string, p netip.Prefix) error {
	link, err := n.h.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("look up %s: %w", ifname, err)
	}
	err = n.h.AddrDel(link, &netlink.Addr{IPNet: toIPNet(p)})
	if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("remove %s from %s: %w", p, ifname, err)
	}
	return nil
}

func toIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func toPrefix(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	bits, _ := n.Mask.Size()
	return netip.PrefixFrom(a, bits), true
}
