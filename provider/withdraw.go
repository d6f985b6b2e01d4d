package provider

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/netroutes"
)

// Withdrawn counts what Withdraw removed.
type Withdrawn struct {
	Routes, VIPRoutes, Neighbours int
}

// Withdraw removes from this host's kernel what a CCM with cfg (as loaded
// by LoadConfigFile) wrote: its pod-CIDR routes, its VIP routes and the
// VIPs' permanent neighbour entries on the load balancer's bridge (only
// addresses of its pools). Removing the package runs it; a restart never
// does, so that answers and routes outlive a restart. A bridge that does
// not exist holds nothing to remove.
func Withdraw(cfg Config) (Withdrawn, error) {
	var (
		out  Withdrawn
		errs []error
	)
	h, err := netlink.NewHandle()
	if err != nil {
		return out, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	if b := cfg.Routes.Bridge; b != "" && linkExists(h, b) {
		rh, err := netlink.NewHandle() // netroutes makes its handle strict
		if err != nil {
			return out, fmt.Errorf("netlink: %w", err)
		}
		defer rh.Close()
		m, err := netroutes.New(rh, netroutes.Config{Bridge: b, Protocol: netlink.RouteProtocol(cfg.Routes.Protocol), Table: cfg.Routes.Table, Metric: cfg.Routes.Metric})
		if err == nil {
			var res netroutes.Result
			res, err = m.Reconcile(nil)
			out.Routes = len(res.Removed)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("routes on %s: %w", b, err))
		}
	}
	if b := cfg.LoadBalancer.Bridge; b != "" && linkExists(h, b) {
		vh, err := netlink.NewHandle() // netroutes makes its handle strict
		if err == nil {
			defer vh.Close()
			var m *netroutes.Manager
			if m, err = netroutes.New(vh, netroutes.Config{Bridge: b, Protocol: netroutes.VIPProtocol}); err == nil {
				out.VIPRoutes, err = m.ReconcilePaths(nil)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("VIP routes on %s: %w", b, err))
		}
		n, err := withdrawNeighbours(h, b, cfg.ParsedPools())
		out.Neighbours = n
		if err != nil {
			errs = append(errs, fmt.Errorf("neighbour entries on %s: %w", b, err))
		}
	}
	return out, errors.Join(errs...)
}

func linkExists(h *netlink.Handle, name string) bool {
	_, err := h.LinkByName(name)
	return err == nil
}

// withdrawNeighbours deletes the permanent neighbour entries on bridge for
// addresses in the pools: the announcer's record of the VIPs it answered.
func withdrawNeighbours(h *netlink.Handle, bridge string, pools *lb.Pools) (int, error) {
	link, err := h.LinkByName(bridge)
	if err != nil {
		return 0, err
	}
	var list []netlink.Neigh
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		l, err := h.NeighList(link.Attrs().Index, family)
		if err != nil {
			return 0, fmt.Errorf("listing: %w", err)
		}
		list = append(list, l...)
	}
	n := 0
	var errs []error
	for i := range list {
		ip, ok := netip.AddrFromSlice(list[i].IP)
		if !ok || list[i].State&netlink.NUD_PERMANENT == 0 {
			continue
		}
		if _, in := pools.For(ip.Unmap()); !in {
			continue
		}
		if err := h.NeighDel(&list[i]); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ip, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
