package libvirtcloud

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/labcloud/labcloud/internal/nstest"
)

// A VIP is never a node address: the host's permanent neighbour entry for a
// VIP (written by the announcer, pointing at the answering node's MAC) must
// not be read back as that node's address, on the real netlink table.
func TestNeighbourTableSkipsPermanentEntries(t *testing.T) {
	if testing.Short() {
		t.Skip("netns test")
	}
	nl := nstest.Handle(t)
	link := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "lctest0"}}
	if err := nl.LinkAdd(link); err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	if err := nl.AddrAdd(link, &netlink.Addr{IPNet: mustIPNet("10.77.0.1/24")}); err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC("52:54:00:00:00:0b")
	for ip, state := range map[string]int{
		"10.77.0.42":  netlink.NUD_REACHABLE, // learned from the guest
		"10.77.0.43":  netlink.NUD_STALE,     // learned, aged
		"10.77.0.200": netlink.NUD_PERMANENT, // the announcer's entry for a VIP
	} {
		if err := nl.NeighAdd(&netlink.Neigh{LinkIndex: link.Attrs().Index, State: state, IP: net.ParseIP(ip), HardwareAddr: mac}); err != nil {
			t.Fatalf("neighbour %s: %v", ip, err)
		}
	}
	table, err := neighbourTable(nl)
	if err != nil {
		t.Fatal(err)
	}
	got := sortAddrs(table["52:54:00:00:00:0b"])
	want := []netip.Addr{netip.MustParseAddr("10.77.0.42"), netip.MustParseAddr("10.77.0.43")}
	if !slices.Equal(got, want) {
		t.Fatalf("addresses of 52:54:00:00:00:0b = %v, want %v (no permanent entry)", got, want)
	}
}

// Addresses in a load-balancer pool are no domain's, whichever source
// reports them (a guest's kube-proxy holds VIPs; a neighbour entry may too).
func TestExcludedAddressesAreNoDomains(t *testing.T) {
	ctx := context.Background()
	vip := netip.MustParseAddr("10.77.0.210")
	neigh := func() (map[string][]netip.Addr, error) {
		return map[string][]netip.Addr{"52:54:00:00:00:0b": {vip, netip.MustParseAddr("10.77.0.42")}}, nil
	}
	inPool := func(ip netip.Addr) bool { return netip.MustParsePrefix("10.77.0.208/28").Contains(ip) }
	h := openFixture(t, Options{Sources: []AddressSource{SourceARP}, Neighbours: neigh, Exclude: inPool})
	d, _ := h.DomainByName("node-b")
	addrs, err := h.Addresses(ctx, d)
	if err != nil || !slices.Equal(addrs, []netip.Addr{netip.MustParseAddr("10.77.0.42")}) {
		t.Fatalf("addresses = %v, %v; want only 10.77.0.42", addrs, err)
	}
	if d, err := h.DomainByAddress(ctx, vip); !errors.Is(err, ErrNotFound) {
		t.Fatalf("DomainByAddress(VIP) = %s, %v; want ErrNotFound", d.Name, err)
	}
}

// The contract's last lookup (a Node matched by its address only) asks the
// sources before it answers "not found": it must not depend on someone
// having asked the domain for its addresses first.
func TestDomainByAddressAsksTheSources(t *testing.T) {
	ctx := context.Background()
	t.Run("arp", func(t *testing.T) {
		neigh := func() (map[string][]netip.Addr, error) {
			return map[string][]netip.Addr{"52:54:00:00:00:0b": {netip.MustParseAddr("10.77.0.42")}}, nil
		}
		h := openFixture(t, Options{Sources: []AddressSource{SourceDHCPLeases, SourceARP}, Neighbours: neigh})
		d, err := h.DomainByAddress(ctx, netip.MustParseAddr("10.77.0.42"))
		if err != nil || d.Name != "node-b" {
			t.Fatalf("DomainByAddress = %q, %v; want node-b", d.Name, err)
		}
		if _, err := h.DomainByAddress(ctx, netip.MustParseAddr("10.77.0.99")); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown address: err = %v, want ErrNotFound", err)
		}
	})
	t.Run("guest agent", func(t *testing.T) {
		// Learn the agent's answer on one hypervisor, look it up on a fresh one.
		learn := openFixture(t, Options{ReadWrite: true, Sources: []AddressSource{SourceGuestAgent}})
		a, _ := learn.DomainByName("node-a")
		addrs, err := learn.Addresses(ctx, a)
		if err != nil || len(addrs) == 0 {
			t.Fatalf("agent addresses of node-a: %v, %v", addrs, err)
		}
		h := openFixture(t, Options{ReadWrite: true, Sources: []AddressSource{SourceDHCPLeases, SourceGuestAgent}})
		d, err := h.DomainByAddress(ctx, addrs[0])
		if err != nil || d.Name != "node-a" {
			t.Fatalf("DomainByAddress(%s) = %q, %v; want node-a", addrs[0], d.Name, err)
		}
	})
	t.Run("unreadable neighbour table is no answer", func(t *testing.T) {
		neigh := func() (map[string][]netip.Addr, error) { return nil, errors.New("netlink: interrupted") }
		h := openFixture(t, Options{Sources: []AddressSource{SourceARP}, Neighbours: neigh})
		_, err := h.DomainByAddress(ctx, netip.MustParseAddr("10.77.0.42"))
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotFound) {
			t.Fatalf("err = %v, want ErrUnavailable", err)
		}
	})
	t.Run("unreachable hypervisor", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		h, err := Open(cctx, Options{URI: "qemu+unix:///system?socket=" + filepath.Join(t.TempDir(), "none"), Zone: "down"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.DomainByAddress(ctx, netip.MustParseAddr("10.77.0.42")); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("err = %v, want ErrUnavailable", err)
		}
	})
}

func mustIPNet(s string) *net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return n
}

// The node controller asks for every Node's addresses at once: they share
// one read of the neighbour table a second, and a later lookup reads it
// again.
func TestNeighbourTableReadOnceASecond(t *testing.T) {
	ctx := context.Background()
	var reads atomic.Int32
	neigh := func() (map[string][]netip.Addr, error) {
		reads.Add(1)
		return map[string][]netip.Addr{"52:54:00:00:00:0b": {netip.MustParseAddr("10.77.0.42")}}, nil
	}
	h := openFixture(t, Options{Sources: []AddressSource{SourceARP}, Neighbours: neigh})
	d, _ := h.DomainByName("node-b")
	for range 100 {
		if addrs, err := h.Addresses(ctx, d); err != nil || len(addrs) != 1 {
			t.Fatalf("addresses = %v, %v", addrs, err)
		}
	}
	if n := reads.Load(); n > 2 {
		t.Errorf("100 lookups read the neighbour table %d times, want at most 2 within %s", n, refreshInterval)
	}
	before := reads.Load()
	time.Sleep(refreshInterval + 100*time.Millisecond)
	if _, err := h.Addresses(ctx, d); err != nil {
		t.Fatal(err)
	}
	if reads.Load() != before+1 {
		t.Errorf("a lookup %s later did not read the table again (%d reads, then %d)", refreshInterval, before, reads.Load())
	}
}

// fixtureURI is the test driver loaded with testdata/<name>.
func fixtureURI(t *testing.T, name string) string {
	t.Helper()
	path, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return "test://" + path
}

// The host's IPv6 neighbours are addresses too, read from the real netlink
// table in the same dump as ARP: global and unique-local ones, not the
// link-local address every NIC has, not the announcer's permanent entry
// for an IPv6 VIP, and not a pool address whatever its state.
func TestIPv6NeighboursAreAddresses(t *testing.T) {
	if testing.Short() {
		t.Skip("netns test")
	}
	nl := nstest.Handle(t)
	link := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "lctest6"}}
	if err := nl.LinkAdd(link); err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"10.77.0.1/24", "fd00:77::1/64"} {
		if err := nl.AddrAdd(link, &netlink.Addr{IPNet: mustIPNet(a), Flags: unix.IFA_F_NODAD}); err != nil {
			t.Fatalf("address %s: %v", a, err)
		}
	}
	mac, _ := net.ParseMAC("52:54:00:00:00:16")
	other, _ := net.ParseMAC("52:54:00:00:00:99")
	for _, n := range []struct {
		ip    string
		state int
		mac   net.HardwareAddr
	}{
		{"10.77.0.42", netlink.NUD_REACHABLE, mac},
		{"fd00:77::5054:ff:fe00:16", netlink.NUD_REACHABLE, mac}, // SLAAC from the MAC
		{"fd00:77::43", netlink.NUD_STALE, mac},                  // a temporary address, aged
		{"fe80::5054:ff:fe00:16", netlink.NUD_REACHABLE, mac},    // link-local: no node address
		{"fd00:77::200", netlink.NUD_PERMANENT, mac},             // the announcer's entry for an IPv6 VIP
		{"fd00:77::201", netlink.NUD_REACHABLE, mac},             // a VIP the node answered for
		{"fd00:77::99", netlink.NUD_REACHABLE, other},
	} {
		if err := nl.NeighAdd(&netlink.Neigh{LinkIndex: link.Attrs().Index, Family: family4or6(n.ip), State: n.state, IP: net.ParseIP(n.ip), HardwareAddr: n.mac}); err != nil {
			t.Fatalf("neighbour %s: %v", n.ip, err)
		}
	}
	a := netip.MustParseAddr
	table, err := neighbourTable(nl)
	if err != nil {
		t.Fatal(err)
	}
	got := sortAddrs(table["52:54:00:00:00:16"])
	want := []netip.Addr{a("10.77.0.42"), a("fd00:77::43"), a("fd00:77::201"), a("fd00:77::5054:ff:fe00:16")}
	if !slices.Equal(got, want) {
		t.Fatalf("neighbour addresses of 52:54:00:00:00:16 = %v, want %v (no link-local, no permanent entry)", got, want)
	}

	inPool := func(ip netip.Addr) bool { return netip.MustParsePrefix("fd00:77::200/124").Contains(ip) }
	h := openFixture(t, Options{URI: fixtureURI(t, "dualstack.xml"), Sources: []AddressSource{SourceDHCPLeases, SourceARP},
		Neighbours: func() (map[string][]netip.Addr, error) { return neighbourTable(nl) }, Exclude: inPool})
	d, err := h.DomainByName("node-6")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.Addresses(context.Background(), d)
	want = []netip.Addr{a("10.77.0.42"), a("fd00:77::5054:ff:fe00:16"), a("fd00:77::43")}
	if err != nil || !slices.Equal(addrs, want) {
		t.Fatalf("Addresses(node-6) = %v, %v; want %v (the MAC's SLAAC address first, no VIP)", addrs, err, want)
	}
	if found, err := h.DomainByAddress(context.Background(), a("fd00:77::43")); err != nil || found.Name != "node-6" {
		t.Errorf("DomainByAddress(fd00:77::43) = %q, %v; want node-6", found.Name, err)
	}
	if _, err := h.DomainByAddress(context.Background(), a("fd00:77::201")); !errors.Is(err, ErrNotFound) {
		t.Errorf("DomainByAddress(IPv6 VIP) = %v, want ErrNotFound", err)
	}
}

func family4or6(ip string) int {
	if netip.MustParseAddr(ip).Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

// Each family comes from the first source that knows it, caches first: a
// guest whose IPv6 address only the guest agent reports and whose IPv4
// address only the neighbour table holds has both.
func TestAddressesOfBothFamilies(t *testing.T) {
	ctx := context.Background()
	a := netip.MustParseAddr
	neigh := func() (map[string][]netip.Addr, error) {
		return map[string][]netip.Addr{"52:54:00:00:00:16": {a("10.77.0.42"), a("fd00:77::abcd"), a("fd00:77::5054:ff:fe00:16")}}, nil
	}
	for _, tc := range []struct {
		name    string
		sources []AddressSource
		want    []netip.Addr
	}{
		// The neighbour table is at hand; an agent not asked yet is not.
		{"neighbour table before an agent not asked yet", []AddressSource{SourceDHCPLeases, SourceGuestAgent, SourceARP}, []netip.Addr{a("10.77.0.42"), a("fd00:77::5054:ff:fe00:16"), a("fd00:77::abcd")}},
		{"neighbour table before the agent", []AddressSource{SourceARP, SourceGuestAgent}, []netip.Addr{a("10.77.0.42"), a("fd00:77::5054:ff:fe00:16"), a("fd00:77::abcd")}},
		// The test driver's agent answers with fd00:77::101 (the network's first range).
		{"agent only", []AddressSource{SourceGuestAgent}, []netip.Addr{a("fd00:77::101")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := openFixture(t, Options{URI: fixtureURI(t, "dualstack.xml"), ReadWrite: true, Sources: tc.sources, Neighbours: neigh})
			d, _ := h.DomainByName("node-6")
			got, err := h.Addresses(ctx, d)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("Addresses = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// A lookup that knows one family asks libvirt for the other only when the
// domain's network has addresses of it: on an IPv4-only network a known
// IPv4 address costs no libvirt call, on a dual-stack one the missing IPv6
// address is asked for (here from the guest agent), once. The agent's
// answer then stands for IPv6: a later source's addresses of that family
// are not mixed in.
func TestMissingFamilyAskedForOnlyWhereTheNetworkHasIt(t *testing.T) {
	ctx := context.Background()
	a := netip.MustParseAddr
	var withV6 atomic.Bool
	neigh := func() (map[string][]netip.Addr, error) {
		table := map[string][]netip.Addr{"52:54:00:00:00:16": {a("10.77.0.42")}, "52:54:00:00:00:0b": {a("10.77.0.42")}}
		if withV6.Load() {
			table["52:54:00:00:00:16"] = append(table["52:54:00:00:00:16"], a("fd00:77::abcd"))
		}
		return table, nil
	}
	sources := []AddressSource{SourceGuestAgent, SourceARP}
	lookup := func(h *Hypervisor, name string) ([]netip.Addr, uint64) {
		t.Helper()
		d, err := h.DomainByName(name)
		if err != nil {
			t.Fatal(err)
		}
		before := h.Calls()
		got, err := h.Addresses(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		return got, h.Calls() - before
	}

	v4only := openFixture(t, Options{ReadWrite: true, Sources: sources, Neighbours: neigh})
	if got, calls := lookup(v4only, "node-b"); !slices.Equal(got, []netip.Addr{a("10.77.0.42")}) || calls != 0 {
		t.Errorf("IPv4-only network: %v with %d libvirt calls; want [10.77.0.42] with none", got, calls)
	}

	dual := openFixture(t, Options{URI: fixtureURI(t, "dualstack.xml"), ReadWrite: true, Sources: sources, Neighbours: neigh})
	want := []netip.Addr{a("10.77.0.42"), a("fd00:77::101")}
	if got, calls := lookup(dual, "node-6"); !slices.Equal(got, want) || calls == 0 {
		t.Errorf("dual-stack network: %v with %d libvirt calls; want %v from the agent", got, calls, want)
	}
	if got, calls := lookup(dual, "node-6"); !slices.Equal(got, want) || calls != 0 {
		t.Errorf("dual-stack network, again: %v with %d libvirt calls; want %v from the caches", got, calls, want)
	}
	withV6.Store(true)
	dual.neighMu.Lock()
	dual.neigh = nil // read the table again now
	dual.neighMu.Unlock()
	if got, _ := lookup(dual, "node-6"); !slices.Equal(got, want) {
		t.Errorf("with an IPv6 neighbour too: %v; want %v, IPv6 from the agent alone", got, want)
	}
}
