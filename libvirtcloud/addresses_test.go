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
