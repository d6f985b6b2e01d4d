package libvirtcloud

import (
	"fmt"
	"net/netip"
	"time"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"
)

// NetworkRange is a range of addresses a libvirt network hands out or
// holds: a DHCP range, or the network's own address on its bridge.
type NetworkRange struct {
	Network     string
	What        string // "DHCP range" or "address"
	First, Last netip.Addr
}

func (r NetworkRange) String() string {
	if r.First == r.Last {
		return fmt.Sprintf("%s %s of libvirt network %q", r.What, r.First, r.Network)
	}
	return fmt.Sprintf("%s %s-%s of libvirt network %q", r.What, r.First, r.Last, r.Network)
}

// NetworkRanges returns the addresses and DHCP ranges of the configured
// networks (or of every active network).
func (h *Hypervisor) NetworkRanges() ([]NetworkRange, error) {
	var out []NetworkRange
	err := h.withConn(func(c *libvirt.Connect) error {
		names := h.opts.Networks
		if len(names) == 0 {
			start := time.Now()
			nets, err := c.ListAllNetworks(libvirt.CONNECT_LIST_NETWORKS_ACTIVE)
			h.called("ListAllNetworks", start)
			if err != nil {
				return fmt.Errorf("list networks on %s: %w", h.opts.URI, err)
			}
			for i := range nets {
				if n, err := nets[i].GetName(); err == nil {
					names = append(names, n)
				}
				nets[i].Free()
			}
		}
		for _, name := range names {
			start := time.Now()
			n, err := c.LookupNetworkByName(name)
			h.called("LookupNetworkByName", start)
			if err != nil {
				return fmt.Errorf("network %q on %s: %w", name, h.opts.URI, err)
			}
			start = time.Now()
			desc, err := n.GetXMLDesc(0)
			h.called("NetworkGetXMLDesc", start)
			n.Free()
			if err != nil {
				return fmt.Errorf("network %q on %s: %w", name, h.opts.URI, err)
			}
			ranges, err := parseNetworkRanges(desc)
			if err != nil {
				return fmt.Errorf("network %q on %s: %w", name, h.opts.URI, err)
			}
			out = append(out, ranges...)
		}
		return nil
	})
	return out, err
}

func parseNetworkRanges(desc string) ([]NetworkRange, error) {
	var x libvirtxml.Network
	if err := x.Unmarshal(desc); err != nil {
		return nil, fmt.Errorf("parse network XML: %w", err)
	}
	var out []NetworkRange
	for _, ip := range x.IPs {
		if a, err := netip.ParseAddr(ip.Address); err == nil {
			out = append(out, NetworkRange{Network: x.Name, What: "address", First: a, Last: a})
		}
		if ip.DHCP == nil {
			continue
		}
		for _, r := range ip.DHCP.Ranges {
			first, err1 := netip.ParseAddr(r.Start)
			last, err2 := netip.ParseAddr(r.End)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("DHCP range %q-%q is not a pair of addresses", r.Start, r.End)
			}
			out = append(out, NetworkRange{Network: x.Name, What: "DHCP range", First: first, Last: last})
		}
	}
	return out, nil
}
