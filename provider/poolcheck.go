package provider

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"go4.org/netipx"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
)

// reserved is a range of addresses that some other party hands out or
// holds on the bridge.
type reserved struct {
	what        string
	first, last netip.Addr
}

// checkPools fails, naming the pool, its range and the other party's range,
// for every pool address that the bridge holds or a DHCP server may lease:
// a VIP leased to a new guest, or equal to the host's own address, is two
// machines answering for one IP.
func checkPools(pools *lb.Pools, taken []reserved) error {
	var errs []error
	for _, p := range pools.List() {
		for _, r := range taken {
			if spec, ok := p.Overlap(r.first, r.last); ok {
				errs = append(errs, fmt.Errorf("loadBalancer.pools: pool %q (%s) overlaps the %s: shrink one of them", p.Name(), spec, r.what))
			}
		}
	}
	return errors.Join(errs...)
}

// poolCheckWait bounds how long start-up waits for a hypervisor to list
// its networks; one that does not answer by then is not checked (and said so).
const poolCheckWait = 10 * time.Second

// checkPoolsAtStart checks the load-balancer pools against the bridge's own
// addresses and the libvirt networks' addresses and DHCP ranges.
func checkPoolsAtStart(ctx context.Context, bridge string, pools *lb.Pools, hvs []*libvirtcloud.Hypervisor) error {
	log := klog.FromContext(ctx)
	taken, err := bridgeAddresses(&netlink.Handle{}, bridge)
	if err != nil {
		log.Info("Load-balancer pools not checked against the bridge's addresses", "bridge", bridge, "reason", err.Error())
	}
	for _, h := range hvs {
		wctx, cancel := context.WithTimeout(ctx, poolCheckWait)
		err := h.WaitSynced(wctx)
		cancel()
		var ranges []libvirtcloud.NetworkRange
		if err == nil {
			ranges, err = h.NetworkRanges()
		}
		if err != nil {
			log.Error(err, "Load-balancer pools not checked against this hypervisor's networks; a pool inside a DHCP range hands VIPs to new guests", "hypervisor", h.URI())
			continue
		}
		for _, r := range ranges {
			taken = append(taken, reserved{what: r.String(), first: r.First, last: r.Last})
		}
	}
	return checkPools(pools, taken)
}

// bridgeAddresses are the host's own addresses on the bridge, in the
// namespace of nl.
func bridgeAddresses(nl *netlink.Handle, bridge string) ([]reserved, error) {
	addrs, err := bridgeAddrList(nl, bridge, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	var out []reserved
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.Unmap().IsLinkLocalUnicast() {
			ip = ip.Unmap()
			out = append(out, reserved{what: fmt.Sprintf("address %s of bridge %s", ip, bridge), first: ip, last: ip})
		}
	}
	return out, nil
}

// subnetEdges are the addresses of the bridge's subnets that no host may
// hold, in the namespace of nl: the network and broadcast addresses of
// IPv4 subnets of four addresses or more, and the subnet-router anycast
// address (RFC 4291 §2.6.1) of IPv6 subnets of four or more. A pool of
// part of a subnet must not hand them out.
func subnetEdges(nl *netlink.Handle, bridge string) ([]netip.Addr, error) {
	addrs, err := bridgeAddrList(nl, bridge, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		pfx, ok := netipx.FromStdIPNet(a.IPNet)
		if !ok {
			continue
		}
		pfx = netip.PrefixFrom(pfx.Addr().Unmap(), pfx.Bits()).Masked()
		switch {
		case pfx.Addr().Is4() && pfx.Bits() <= 30:
			r := netipx.RangeOfPrefix(pfx)
			out = append(out, r.From(), r.To())
		case pfx.Addr().Is6() && !pfx.Addr().IsLinkLocalUnicast() && pfx.Bits() <= 126:
			out = append(out, pfx.Addr())
		}
	}
	return out, nil
}

// bridgeAddrList lists the addresses of family on bridge, in the namespace
// of nl; errors name the bridge.
func bridgeAddrList(nl *netlink.Handle, bridge string, family int) ([]netlink.Addr, error) {
	link, err := nl.LinkByName(bridge)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", bridge, err)
	}
	addrs, err := nl.AddrList(link, family)
	if err != nil {
		return nil, fmt.Errorf("addresses of bridge %s: %w", bridge, err)
	}
	return addrs, nil
}
