package host

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/labcloud/labcloud/netroutes"
)

// Routes are the routes of one protocol on bridge (the CCM's pod-CIDR
// routes for netroutes.DefaultProtocol); none while the bridge does not
// exist.
func Routes(bridge string, protocol netlink.RouteProtocol) ([]netroutes.Route, error) {
	return RoutesIn("", bridge, protocol)
}

// PodCIDRRoutes are the CCM's routes to pod CIDRs on bridge in the named
// network namespace ("": this one): destination → gateway.
func PodCIDRRoutes(netnsName, bridge string) (map[string]string, error) {
	routes, err := RoutesIn(netnsName, bridge, netroutes.DefaultProtocol)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(routes))
	for _, r := range routes {
		out[r.Dst.String()] = r.Gateway.String()
	}
	return out, nil
}

// RoutesIn is Routes in the named network namespace ("": this one).
func RoutesIn(netnsName, bridge string, protocol netlink.RouteProtocol) ([]netroutes.Route, error) {
	var routes []netroutes.Route
	err := withRoutes(netnsName, bridge, protocol, func(m *netroutes.Manager) (err error) {
		routes, err = m.List()
		return err
	})
	return routes, err
}

// SpreadRoutes are the CCM's multipath routes to VIPs on bridge; none
// while the bridge does not exist.
func SpreadRoutes(bridge string) ([]netroutes.Paths, error) {
	var paths []netroutes.Paths
	err := withRoutes("", bridge, netroutes.VIPProtocol, func(m *netroutes.Manager) (err error) {
		paths, err = m.ListPaths()
		return err
	})
	return paths, err
}

// withRoutes runs f with a Manager of the bridge's routes of one protocol,
// on a netlink handle of its own in the named network namespace ("": this
// one).
func withRoutes(netnsName, bridge string, protocol netlink.RouteProtocol, f func(*netroutes.Manager) error) error {
	h, err := netlink.NewHandle()
	if netnsName != "" {
		ns, nerr := netns.GetFromName(netnsName)
		if nerr != nil {
			return fmt.Errorf("network namespace %s: %w", netnsName, nerr)
		}
		defer ns.Close()
		h, err = netlink.NewHandleAt(ns)
	}
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	m, err := netroutes.New(h, netroutes.Config{Bridge: bridge, Protocol: protocol})
	if err == nil {
		err = f(m)
	}
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("routes on %s: %w", bridge, err)
	}
	return nil
}

// PermanentNeighbours are the permanent neighbour entries (both families) on bridge
// (the CCM's entries for VIPs): IP → MAC.
func PermanentNeighbours(bridge string) map[string]string {
	out := map[string]string{}
	link, err := netlink.LinkByName(bridge)
	if err != nil {
		return out
	}
	neighs, err := netlink.NeighList(link.Attrs().Index, netlink.FAMILY_ALL)
	if err != nil {
		return out
	}
	for _, n := range neighs {
		if n.State&netlink.NUD_PERMANENT == 0 || n.HardwareAddr == nil {
			continue
		}
		if ip, ok := netip.AddrFromSlice(n.IP); ok {
			out[ip.Unmap().String()] = strings.ToLower(net.HardwareAddr(n.HardwareAddr).String())
		}
	}
	return out
}

// Ports names bridge's ports.
func Ports(bridge string) ([]string, error) {
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", bridge, err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var out []string
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			out = append(out, l.Attrs().Name)
		}
	}
	return out, nil
}

// Replug makes ports (those that still exist) ports of bridge again.
func Replug(bridge string, ports []string) error {
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", bridge, err)
	}
	for _, p := range ports {
		l, err := netlink.LinkByName(p)
		if err != nil {
			continue // gone with its guest
		}
		if l.Attrs().MasterIndex == br.Attrs().Index {
			continue // libvirt attached it already
		}
		if err := netlink.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("attach %s to %s: %w", p, bridge, err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("link up %s: %w", p, err)
		}
	}
	return nil
}
