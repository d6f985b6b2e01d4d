package libvirtcloud

import (
	"context"
	"errors"
	"fmt"
	"net"
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
// that just booted gets its lease seconds after its domain starts, its
// DHCPv6 lease seconds after its IPv4 one), and
// the node controller asks for every Node's addresses at once, at start
// and every 5 minutes: each read of the neighbour table decodes all of it,
// an entry per guest and per VIP, so 1000 Nodes read it once a second
// instead of 1000 times.
const refreshInterval = time.Second

// neighbourDumpAttempts bounds the re-reads of a neighbour table dump the
// kernel marked as interrupted by a concurrent change (the announcer
// writes neighbour entries as VIPs move).
const neighbourDumpAttempts = 5

// agentRetryInterval is how long "the agent gave no address" is believed.
const agentRetryInterval = 30 * time.Second

type agentAnswer struct {
	addrs []netip.Addr
	at    time.Time
}

// Addresses returns d's addresses, IPv4 first. Each family comes from the
// first source that knows an address of that family: a guest whose IPv4
// address is leased while its IPv6 address is only in the neighbour table
// (SLAAC) has both. Caches are consulted for every source before libvirt is
// asked, and libvirt is asked only when no address at all is known or a
// family that d's libvirt networks have addresses of is missing: a node
// whose addresses are known costs no libvirt call, and an IPv4-only network
// never makes a lookup ask for IPv6. No source knowing any address is not
// an error: many guests have none before they boot. Addresses that
// Options.Exclude names (load-balancer VIPs) are never a domain's.
func (h *Hypervisor) Addresses(ctx context.Context, d Domain) ([]netip.Addr, error) {
	var addrs []netip.Addr
	var have family
	for _, ask := range []bool{false, true} {
		need := familyV4 | familyV6
		if ask {
			if have != 0 {
				need = h.awaited(d)
			}
			if need &^= have; need == 0 {
				break
			}
		}
		for _, src := range h.opts.Sources {
			var (
				got []netip.Addr
				err error
			)
			switch src {
			case SourceDHCPLeases:
				got, err = h.leaseAddresses(d, need&^have, ask)
			case SourceGuestAgent:
				got, err = h.agentAddresses(d, need&^have, ask)
			case SourceARP:
				got, err = h.neighbourAddresses(d)
			}
			if err != nil {
				return nil, err
			}
			addrs, have = h.take(addrs, have, got, need&^have)
		}
	}
	return sortAddrs(addrs, macsOf(d)...), nil
}

// take appends to addrs the addresses of got in the families of want that
// are not excluded, and returns the families addrs then holds. It never
// writes to got, which may be a cache's.
func (h *Hypervisor) take(addrs []netip.Addr, have family, got []netip.Addr, want family) ([]netip.Addr, family) {
	var took family
	for _, a := range got {
		a = a.Unmap()
		if f := familyOf(a); want&f != 0 && (h.opts.Exclude == nil || !h.opts.Exclude(a)) {
			addrs = append(addrs, a)
			took |= f
		}
	}
	return addrs, have | took
}

// awaited are the families of the addresses of d's libvirt networks (as
// last read with the leases): a guest on such a network may yet get an
// address of that family, so a lookup missing it asks the sources.
func (h *Hypervisor) awaited(d Domain) family {
	h.mu.RLock()
	defer h.mu.RUnlock()
	var f family
	for _, i := range d.Interfaces {
		if i.Network != "" {
			f |= h.netFamilies[i.Network]
		}
	}
	return f
}

// family is a set of address families.
type family uint8

const (
	familyV4 family = 1 << iota
	familyV6
)

func familyOf(a netip.Addr) family {
	if a.Unmap().Is4() {
		return familyV4
	}
	return familyV6
}

// covers says whether addrs hold an address of one of the families in f.
func covers(addrs []netip.Addr, f family) bool {
	return slices.ContainsFunc(addrs, func(a netip.Addr) bool { return familyOf(a)&f != 0 })
}

func macsOf(d Domain) []string {
	macs := make([]string, len(d.Interfaces))
	for i, ifc := range d.Interfaces {
		macs[i] = ifc.MAC
	}
	return macs
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
				addrs, err := h.agentAddresses(cand, familyOf(ip), true)
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

// sortAddrs orders addrs IPv4 first, then IPv6; within IPv6, the SLAAC
// addresses made from one of macs (modified EUI-64) first, as they last as
// long as the NIC while temporary (privacy) addresses come and go; then by
// value. Repeats are dropped.
func sortAddrs(addrs []netip.Addr, macs ...string) []netip.Addr {
	var euis [][8]byte
	for _, m := range macs {
		if id, ok := eui64(m); ok {
			euis = append(euis, id)
		}
	}
	fromMAC := func(a netip.Addr) bool {
		b := a.As16()
		return a.Is6() && slices.Contains(euis, [8]byte(b[8:]))
	}
	slices.SortFunc(addrs, func(a, b netip.Addr) int {
		if a.Is4() != b.Is4() {
			if a.Is4() {
				return -1
			}
			return 1
		}
		if fa, fb := fromMAC(a), fromMAC(b); fa != fb {
			if fa {
				return -1
			}
			return 1
		}
		return a.Compare(b)
	})
	return slices.Compact(addrs)
}

// eui64 is the interface identifier SLAAC makes from a MAC (RFC 4291
// appendix A): ff:fe in the middle, the universal/local bit flipped.
func eui64(mac string) ([8]byte, bool) {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return [8]byte{}, false
	}
	return [8]byte{hw[0] ^ 0x02, hw[1], hw[2], 0xff, 0xfe, hw[3], hw[4], hw[5]}, true
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
// first if the cache holds none of the families in need and is older than
// refreshInterval.
func (h *Hypervisor) leaseAddresses(d Domain, need family, ask bool) ([]netip.Addr, error) {
	addrs := h.cachedLeases(d)
	if covers(addrs, need) || !ask || len(d.Interfaces) == 0 {
		return addrs, nil
	}
	if err := h.refreshLeases(); err != nil {
		return nil, err
	}
	return h.cachedLeases(d), nil
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
	var read leaseRead
	err := h.withConn(func(c *libvirt.Connect) error {
		var err error
		read, err = h.readLeases(c)
		return err
	})
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.leases, h.netFamilies, h.leasesAt = read.byMAC, read.families, time.Now()
	h.mu.Unlock()
	return nil
}

// leaseRead is what one read of the networks gives.
type leaseRead struct {
	byMAC    map[string][]netip.Addr // mac → addresses from DHCP leases, both families
	families map[string]family       // network → families of its addresses
}

// readLeases reads the DHCP leases of the configured (or all active)
// networks, and the families each network has addresses of.
func (h *Hypervisor) readLeases(c *libvirt.Connect) (leaseRead, error) {
	out := leaseRead{byMAC: map[string][]netip.Addr{}, families: map[string]family{}}
	names := h.opts.Networks
	if len(names) == 0 {
		start := time.Now()
		nets, err := c.ListAllNetworks(libvirt.CONNECT_LIST_NETWORKS_ACTIVE)
		h.called("ListAllNetworks", start)
		if err != nil {
			if isUnsupported(err) {
				return out, nil
			}
			return leaseRead{}, fmt.Errorf("list networks on %s: %w", h.opts.URI, err)
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
	for _, name := range names {
		start := time.Now()
		n, err := c.LookupNetworkByName(name)
		h.called("LookupNetworkByName", start)
		if err != nil {
			return leaseRead{}, fmt.Errorf("network %q on %s: %w", name, h.opts.URI, err)
		}
		start = time.Now()
		desc, err := n.GetXMLDesc(0)
		h.called("NetworkGetXMLDesc", start)
		if err == nil {
			out.families[name] = networkFamilies(desc)
		}
		start = time.Now()
		leases, err := n.GetDHCPLeases()
		h.called("GetDHCPLeases", start)
		n.Free()
		if isUnsupported(err) {
			continue // the test driver keeps no leases
		}
		if err != nil {
			return leaseRead{}, fmt.Errorf("DHCP leases of network %q on %s: %w", name, h.opts.URI, err)
		}
		leaseTable(leases, out.byMAC)
	}
	return out, nil
}

// networkFamilies are the families of a network's addresses; none when
// its XML cannot be read, so that nothing is awaited from it.
func networkFamilies(desc string) family {
	ranges, err := parseNetworkRanges(desc)
	if err != nil {
		return 0
	}
	var f family
	for _, r := range ranges {
		f |= familyOf(r.First)
	}
	return f
}

// agentAddresses reads the agent cache; with ask, it queries the guest
// agent of a running domain whose cached answer holds none of the families
// in need, unless it was asked less than agentRetryInterval ago. Answers
// without an address, and "no agent", are cached too: most guests run none.
func (h *Hypervisor) agentAddresses(d Domain, need family, ask bool) ([]netip.Addr, error) {
	h.mu.RLock()
	cached, ok := h.agent[d.UUID]
	h.mu.RUnlock()
	if covers(cached.addrs, need) || !ask || d.State != StateRunning || (ok && time.Since(cached.at) < agentRetryInterval) {
		return cached.addrs, nil
	}
	var ifaces []libvirt.DomainInterface
	err := h.withConn(func(c *libvirt.Connect) error {
		start := time.Now()
		dom, err := c.LookupDomainByUUIDString(d.UUID)
		h.called("LookupDomainByUUIDString", start)
		if err != nil {
			return err
		}
		defer dom.Free()
		start = time.Now()
		ifaces, err = dom.ListAllInterfaceAddresses(libvirt.DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT)
		h.called("ListAllInterfaceAddresses", start)
		return err
	})
	var lerr libvirt.Error
	switch {
	case err == nil:
	case errors.As(err, &lerr) && (lerr.Code == libvirt.ERR_AGENT_UNRESPONSIVE || lerr.Code == libvirt.ERR_ARGUMENT_UNSUPPORTED ||
		lerr.Code == libvirt.ERR_OPERATION_INVALID || lerr.Code == libvirt.ERR_NO_SUPPORT || lerr.Code == libvirt.ERR_OPERATION_DENIED):
		// No agent in the guest is the common case, not a failure.
	case isNoDomain(err):
	default:
		return nil, fmt.Errorf("guest agent addresses of %s: %w", d.Name, err)
	}
	addrs := agentTable(ifaces, macsOf(d))
	h.mu.Lock()
	h.agent[d.UUID] = agentAnswer{addrs: addrs, at: time.Now()}
	h.mu.Unlock()
	return addrs, nil
}

// agentTable are the usable addresses of the guest's interfaces whose MAC
// is one of the domain's (macs). The agent lists every interface in the
// guest: the CNI bridge, kube-ipvs0 with every Service IP, tunnels; those
// are no address of the node on the host's network. Only when no interface
// has a domain MAC (renamed in the guest) are all interfaces taken.
func agentTable(ifaces []libvirt.DomainInterface, macs []string) []netip.Addr {
	ours := slices.ContainsFunc(ifaces, func(i libvirt.DomainInterface) bool { return slices.Contains(macs, strings.ToLower(i.Hwaddr)) })
	var addrs []netip.Addr
	for _, i := range ifaces {
		if ours && !slices.Contains(macs, strings.ToLower(i.Hwaddr)) {
			continue
		}
		for _, a := range i.Addrs {
			if ip, err := netip.ParseAddr(a.Addr); err == nil && usable(ip.Unmap()) {
				addrs = append(addrs, ip.Unmap())
			}
		}
	}
	return addrs
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

// neighbourTable reads the neighbour tables (ARP and IPv6 neighbour
// discovery) of the namespace of nl as mac → addresses. It skips entries
// that failed or are incomplete, and permanent ones: those are written by
// hand or by the load-balancer announcer (the host's entry for a VIP,
// pointing at the answering node's MAC), not learned from a guest, so they
// are no evidence of a guest's address. Link-local IPv6 addresses (every
// guest has one) are no node address either.
func neighbourTable(nl *netlink.Handle) (map[string][]netip.Addr, error) {
	var neighs []netlink.Neigh
	var err error
	for range neighbourDumpAttempts {
		// AF_UNSPEC: both families in one dump.
		if neighs, err = nl.NeighList(0, netlink.FAMILY_ALL); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
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
