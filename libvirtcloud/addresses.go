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

// refreshInterval bounds how often lookups re-read the DHCP leases and the
// neighbour table. A lookup that finds no lease may re-read them (a guest
// that just booted gets its lease seconds after its domain starts), and
// the node controller asks for every Node's addresses at once, at start
// and every 5 minutes: each read of the neighbour table decodes all of it,
// an entry per guest and per VIP, so 1000 Nodes read it once a second
// instead of 1000 times.
const refreshInterval = time.Second

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
// they boot. Addresses that Options.Exclude names (load-balancer VIPs) are
// never a domain's.
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
			if addrs = h.withoutExcluded(addrs); len(addrs) > 0 {
				return sortAddrs(addrs), nil
			}
		}
	}
	return nil, nil
}

// withoutExcluded drops the addresses that are never a domain's.
func (h *Hypervisor) withoutExcluded(addrs []netip.Addr) []netip.Addr {
	if h.opts.Exclude == nil {
		return addrs
	}
	return slices.DeleteFunc(addrs, h.opts.Exclude)
}

// DomainByAddress finds the domain that has ip, according to the address
// sources: the caches first, then each configured source is asked (leases
// re-read, guest agents queried, the neighbour table read) before the
// answer can be ErrNotFound. It fails with ErrUnavailable when the
// hypervisor or a source cannot be asked. An excluded address (a VIP) is
// no domain's.
func (h *Hypervisor) DomainByAddress(ctx context.Context, ip netip.Addr) (Domain, error) {
	ip = ip.Unmap()
	if !h.Connected() {
		return Domain{}, fmt.Errorf("domain with address %s on %s: %w", ip, h.opts.URI, ErrUnavailable)
	}
	notFound := fmt.Errorf("domain with address %s on %s: %w", ip, h.opts.URI, ErrNotFound)
	if h.opts.Exclude != nil && h.opts.Exclude(ip) {
		return Domain{}, notFound
	}
	h.mu.RLock()
	d, ok := h.domains.byAddress(ip, h.leases, h.agent)
	h.mu.RUnlock()
	if ok {
		return d, nil
	}
	unavailable := func(err error) (Domain, error) {
		return Domain{}, fmt.Errorf("domain with address %s on %s: %w: %w", ip, h.opts.URI, ErrUnavailable, err)
	}
	for _, src := range h.opts.Sources {
		switch src {
		case SourceDHCPLeases:
			if err := h.refreshLeases(); err != nil {
				return unavailable(err)
			}
			h.mu.RLock()
			d, ok = h.domains.byAddress(ip, h.leases, nil)
			h.mu.RUnlock()
		case SourceGuestAgent:
			for _, cand := range h.Domains() {
				addrs, err := h.agentAddresses(cand, true)
				if err != nil {
					return unavailable(err)
				}
				if slices.Contains(addrs, ip) {
					d, ok = cand, true
					break
				}
			}
		case SourceARP:
			table, err := h.neighbours()
			if err != nil {
				return unavailable(fmt.Errorf("read neighbour table: %w", err))
			}
			h.mu.RLock()
			d, ok = h.domains.byAddress(ip, table, nil)
			h.mu.RUnlock()
		}
		if ok {
			return d, nil
		}
	}
	return Domain{}, notFound
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

func (h *Hypervisor) cachedLeases(d Domain) []netip.Addr {
	h.mu.RLock()
	defer h.mu.RUnlock()
	var addrs []netip.Addr
	for _, i := range d.Interfaces {
		addrs = append(addrs, h.leases[i.MAC]...)
	}
	return addrs
}

// leaseAddresses reads the lease cache; with ask, it re-reads the leases
// first if they are older than refreshInterval.
func (h *Hypervisor) leaseAddresses(d Domain, ask bool) ([]netip.Addr, error) {
	addrs := h.cachedLeases(d)
	if len(addrs) > 0 || !ask || len(d.Interfaces) == 0 {
		return addrs, nil
	}
	if err := h.refreshLeases(); err != nil {
		return nil, err
	}
	addrs = h.cachedLeases(d)
	return addrs, nil
}

// refreshLeases re-reads the leases unless they were read less than
// refreshInterval ago.
func (h *Hypervisor) refreshLeases() error {
	h.mu.RLock()
	fresh := time.Since(h.leasesAt) <= refreshInterval
	h.mu.RUnlock()
	if fresh {
		return nil
	}
	var leases map[string][]netip.Addr
	err := h.withConn(func(c *libvirt.Connect) error {
		var err error
		leases, err = h.readLeases(c)
		return err
	})
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.leases, h.leasesAt = leases, time.Now()
	h.mu.Unlock()
	return nil
}

// readLeases reads the DHCP leases of the configured (or all active)
// networks into mac → addresses.
func (h *Hypervisor) readLeases(c *libvirt.Connect) (map[string][]netip.Addr, error) {
	names := h.opts.Networks
	if len(names) == 0 {
		start := time.Now()
		nets, err := c.ListAllNetworks(libvirt.CONNECT_LIST_NETWORKS_ACTIVE)
		h.called("ListAllNetworks", start)
		if err != nil {
			if isUnsupported(err) {
				return map[string][]netip.Addr{}, nil
			}
			return nil, fmt.Errorf("list networks on %s: %w", h.opts.URI, err)
		}
		for i := range nets {
			start := time.Now()
			n, err := nets[i].GetName()
			h.called("NetworkGetName", start)
			if err == nil {
				names = append(names, n)
			}
			nets[i].Free()
		}
	}
	out := map[string][]netip.Addr{}
	for _, name := range names {
		start := time.Now()
		n, err := c.LookupNetworkByName(name)
		h.called("LookupNetworkByName", start)
		if err != nil {
			return nil, fmt.Errorf("network %q on %s: %w", name, h.opts.URI, err)
		}
		start = time.Now()
		leases, err := n.GetDHCPLeases()
		h.called("GetDHCPLeases", start)
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
		start := time.Now()
		dom, err := c.LookupDomainByUUIDString(d.UUID)
		h.called("LookupDomainByUUIDString", start)
		if err != nil {
			return err
		}
		defer dom.Free()
		start = time.Now()
		ifaces, err := dom.ListAllInterfaceAddresses(libvirt.DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT)
		h.called("ListAllInterfaceAddresses", start)
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
	table, err := h.neighbours()
	if err != nil {
		return nil, fmt.Errorf("read neighbour table: %w", err)
	}
	var addrs []netip.Addr
	for _, i := range d.Interfaces {
		addrs = append(addrs, table[i.MAC]...)
	}
	return addrs, nil
}

// neighbours is the host's neighbour table, re-read unless it was read
// less than refreshInterval ago. The table is shared: callers only read it.
func (h *Hypervisor) neighbours() (map[string][]netip.Addr, error) {
	h.neighMu.Lock()
	defer h.neighMu.Unlock()
	if h.neigh != nil && time.Since(h.neighAt) <= refreshInterval {
		return h.neigh, nil
	}
	table, err := h.opts.Neighbours()
	if err != nil {
		return nil, err
	}
	h.neigh, h.neighAt = table, time.Now()
	return table, nil
}

// neighbourTable reads the neighbour table of the namespace of nl as
// mac → addresses. It skips entries that failed or are incomplete, and
// permanent ones: those are written by hand or by the load-balancer
// announcer (the host's entry for a VIP, pointing at the answering node's
// MAC), not learned from a guest, so they are no evidence of a guest's
// address.
func neighbourTable(nl *netlink.Handle) (map[string][]netip.Addr, error) {
	neighs, err := nl.NeighList(0, 0)
	if err != nil {
		return nil, err
	}
	out := map[string][]netip.Addr{}
	for _, n := range neighs {
		if n.HardwareAddr == nil || n.State&(netlink.NUD_FAILED|netlink.NUD_INCOMPLETE|netlink.NUD_NOARP|netlink.NUD_PERMANENT) != 0 {
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
