package libvirtcloud

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"libvirt.org/go/libvirt"
)

// AddressSource is where a domain's addresses may be learned.
type AddressSource int

const (
	// SourceDHCPLeases reads the libvirt networks' DHCP leases.
	SourceDHCPLeases AddressSource = iota
	// SourceGuestAgent asks the QEMU guest agent (needs a read-write connection).
	SourceGuestAgent
	// SourceARP reads the host's neighbour table.
	SourceARP
)

// leaseRefreshInterval bounds how often a lookup that finds no lease may
// re-read the leases (a guest that just booted gets its lease seconds
// after its domain starts).
const leaseRefreshInterval = time.Second

// agentRetryInterval is how long "the agent gave no address" is believed.
const agentRetryInterval = 30 * time.Second

type agentAnswer struct {
	addrs []netip.Addr
	at    time.Time
}

// Addresses returns d's addresses from the first source that knows any,
// IPv4 first. Caches are consulted for every source before libvirt is
// asked, so a node whose addresses are known costs no libvirt call. No
// source knowing any address is not an error: many guests have none before
// they boot.
func (h *Hypervisor) Addresses(ctx context.Context, d Domain) ([]netip.Addr, error) {
	for _, ask := range []bool{false, true} {
		for _, src := range h.opts.Sources {
			var (
				addrs []netip.Addr
				err   error
			)
			switch src {
			case SourceDHCPLeases:
				addrs, err = h.leaseAddresses(d, ask)
			case SourceGuestAgent:
				addrs, err = h.agentAddresses(d, ask)
			case SourceARP:
				addrs, err = h.neighbourAddresses(d)
			}
			if err != nil {
				return nil, err
			}
			if len(addrs) > 0 {
				return sortAddrs(addrs), nil
			}
		}
	}
	return nil, nil
}

func sortAddrs(addrs []netip.Addr) []netip.Addr {
	slices.SortFunc(addrs, func(a, b netip.Addr) int {
		if a.Is4() != b.Is4() {
			if a.Is4() {
				return -1
			}
			return 1
		}
		return a.Compare(b)
	})
	return slices.Compact(addrs)
}

func (h *Hypervisor) cachedLeases(d Domain) (addrs []netip.Addr, stale bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for _, i := range d.Interfaces {
		addrs = append(addrs, h.leases[i.MAC]...)
	}
	return addrs, time.Since(h.leasesAt) > leaseRefreshInterval
}

// leaseAddresses reads the lease cache; with ask, it re-reads the leases
// first if they are older than leaseRefreshInterval.
func (h *Hypervisor) leaseAddresses(d Domain, ask bool) ([]netip.Addr, error) {
	addrs, stale := h.cachedLeases(d)
	if len(addrs) > 0 || !ask || !stale || len(d.Interfaces) == 0 {
		return addrs, nil
	}
	var leases map[string][]netip.Addr
	err := h.withConn(func(c *libvirt.Connect) error {
		var err error
		leases, err = h.readLeases(c)
		return err
	})
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.leases, h.leasesAt = leases, time.Now()
	h.mu.Unlock()
	addrs, _ = h.cachedLeases(d)
	return addrs, nil
}

// readLeases reads the DHCP leases of the configured (or all active)
// networks into mac → addresses.
func (h *Hypervisor) readLeases(c *libvirt.Connect) (map[string][]netip.Addr, error) {
	names := h.opts.Networks
	if len(names) == 0 {
		h.calls.Add(1)
		nets, err := c.ListAllNetworks(libvirt.CONNECT_LIST_NETWORKS_ACTIVE)
		if err != nil {
			if isUnsupported(err) {
				return map[string][]netip.Addr{}, nil
			}
			return nil, fmt.Errorf("list networks on %s: %w", h.opts.URI, err)
		}
		for i := range nets {
			h.calls.Add(1)
			if n, err := nets[i].GetName(); err == nil {
				names = append(names, n)
			}
			nets[i].Free()
		}
	}
	out := map[string][]netip.Addr{}
	for _, name := range names {
		h.calls.Add(2)
		n, err := c.LookupNetworkByName(name)
		if err != nil {
			return nil, fmt.Errorf("network %q on %s: %w", name, h.opts.URI, err)
		}
		leases, err := n.GetDHCPLeases()
		n.Free()
		if isUnsupported(err) {
			continue // the test driver keeps no leases
		}
		if err != nil {
			return nil, fmt.Errorf("DHCP leases of network %q on %s: %w", name, h.opts.URI, err)
		}
		for _, l := range leases {
			if a, err := netip.ParseAddr(l.IPaddr); err == nil && l.Mac != "" {
				mac := strings.ToLower(l.Mac)
				out[mac] = append(out[mac], a)
			}
		}
	}
	return out, nil
}

// agentAddresses reads the agent cache; with ask, it queries the guest
// agent for a running domain with no fresh cached answer. Empty answers
// are cached too, for agentRetryInterval, as most guests run no agent.
func (h *Hypervisor) agentAddresses(d Domain, ask bool) ([]netip.Addr, error) {
	h.mu.RLock()
	cached, ok := h.agent[d.UUID]
	h.mu.RUnlock()
	if len(cached.addrs) > 0 || !ask || d.State != StateRunning || (ok && time.Since(cached.at) < agentRetryInterval) {
		return cached.addrs, nil
	}
	var addrs []netip.Addr
	err := h.withConn(func(c *libvirt.Connect) error {
		h.calls.Add(2)
		dom, err := c.LookupDomainByUUIDString(d.UUID)
		if err != nil {
			return err
		}
		defer dom.Free()
		ifaces, err := dom.ListAllInterfaceAddresses(libvirt.DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT)
		if err != nil {
			return err
		}
		for _, i := range ifaces {
			for _, a := range i.Addrs {
				if ip, err := netip.ParseAddr(a.Addr); err == nil && usable(ip) {
					addrs = append(addrs, ip)
				}
			}
		}
		return nil
	})
	if err != nil {
		// No agent in the guest is the common case, not a failure.
		var lerr libvirt.Error
		if errors.As(err, &lerr) && (lerr.Code == libvirt.ERR_AGENT_UNRESPONSIVE || lerr.Code == libvirt.ERR_ARGUMENT_UNSUPPORTED ||
			lerr.Code == libvirt.ERR_OPERATION_INVALID || lerr.Code == libvirt.ERR_NO_SUPPORT || lerr.Code == libvirt.ERR_OPERATION_DENIED) {
			return nil, nil
		}
		if !isNoDomain(err) {
			return nil, fmt.Errorf("guest agent addresses of %s: %w", d.Name, err)
		}
	}
	h.mu.Lock()
	h.agent[d.UUID] = agentAnswer{addrs: addrs, at: time.Now()}
	h.mu.Unlock()
	return addrs, nil
}

func (h *Hypervisor) neighbourAddresses(d Domain) ([]netip.Addr, error) {
	table, err := h.opts.Neighbours()
	if err != nil {
		return nil, fmt.Errorf("read neighbour table: %w", err)
	}
	var addrs []netip.Addr
	for _, i := range d.Interfaces {
		addrs = append(addrs, table[i.MAC]...)
	}
	return addrs, nil
}

// neighbourTable reads the current namespace's neighbour table as
// mac → addresses, ignoring entries that failed or are incomplete.
func neighbourTable() (map[string][]netip.Addr, error) {
	neighs, err := netlink.NeighList(0, 0)
	if err != nil {
		return nil, err
	}
	out := map[string][]netip.Addr{}
	for _, n := range neighs {
		if n.HardwareAddr == nil || n.State&(netlink.NUD_FAILED|netlink.NUD_INCOMPLETE|netlink.NUD_NOARP) != 0 {
			continue
		}
		if ip, ok := netip.AddrFromSlice(n.IP); ok && usable(ip.Unmap()) {
			mac := strings.ToLower(n.HardwareAddr.String())
			out[mac] = append(out[mac], ip.Unmap())
		}
	}
	return out, nil
}

// usable excludes addresses a node cannot be reached at from the host.
func usable(ip netip.Addr) bool {
	return ip.IsValid() && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() && !ip.IsMulticast() && !ip.IsUnspecified()
}
