package libvirtcloud

import (
	"maps"
	"net/netip"
	"slices"
	"testing"

	"libvirt.org/go/libvirt"
)

// Leases of both families are matched to the NIC that holds them: by the
// MAC libvirt records (for DHCPv6 too, as its lease helper writes it),
// else by the MAC inside the client identifier or DUID.
func TestLeaseTable(t *testing.T) {
	v4, v6 := libvirt.IP_ADDR_TYPE_IPV4, libvirt.IP_ADDR_TYPE_IPV6
	leases := []libvirt.NetworkDHCPLease{
		{Type: v4, Mac: "52:54:00:00:00:0A", IPaddr: "10.77.0.101", Clientid: "01:52:54:00:00:00:0a"},
		// DHCPv6 as libvirt records it: dnsmasq's MAC, the DUID (here a
		// DUID-UUID, no MAC in it) and the IAID besides.
		{Type: v6, Mac: "52:54:00:00:00:0a", Iaid: "1611004", IPaddr: "fd00:77::1a", Clientid: "00:04:6c:7f:d3:3a:7c:58:4b:3e:9b:f0:1e:5a:6d:0f:64:7a"},
		// No MAC: a DUID-LL, a DUID-LLT (without colons) name the NIC.
		{Type: v6, IPaddr: "fd00:77::1b", Clientid: "00:03:00:01:52:54:00:00:00:0b"},
		{Type: v6, IPaddr: "fd00:77::1c", Clientid: "000100012c5e1a2b52540000000c"},
		// dnsmasq's hardware type prefix for Ethernet.
		{Type: v6, Mac: "01-52:54:00:00:00:0d", IPaddr: "fd00:77::1d"},
		// DHCPv4 with an RFC 4361 identifier (systemd-networkd), no MAC.
		{Type: v4, IPaddr: "10.77.0.105", Clientid: "ff:b6:22:0a:3d:00:03:00:01:52:54:00:00:00:0e"},
		// Nobody's: a DUID-EN and no MAC; a non-Ethernet hardware type;
		// an address that does not parse; a link-local address.
		{Type: v6, IPaddr: "fd00:77::e1", Clientid: "00:02:00:00:ab:11:9a:3c:72:0e:15:c2"},
		{Type: v6, Mac: "20-52:54:00:00:00:0f", IPaddr: "fd00:77::e2"},
		{Type: v4, Mac: "52:54:00:00:00:0a", IPaddr: "10.77.0.300"},
		{Type: v6, Mac: "52:54:00:00:00:0a", IPaddr: "fe80::5054:ff:fe00:a"},
	}
	got := map[string][]netip.Addr{}
	leaseTable(leases, got)
	a := netip.MustParseAddr
	want := map[string][]netip.Addr{
		"52:54:00:00:00:0a": {a("10.77.0.101"), a("fd00:77::1a")},
		"52:54:00:00:00:0b": {a("fd00:77::1b")},
		"52:54:00:00:00:0c": {a("fd00:77::1c")},
		"52:54:00:00:00:0d": {a("fd00:77::1d")},
		"52:54:00:00:00:0e": {a("10.77.0.105")},
	}
	if !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("lease table = %v\nwant %v", got, want)
	}
}

func TestMACFromClientID(t *testing.T) {
	for _, tc := range []struct {
		id, want string
	}{
		{"01:52:54:00:00:00:0a", "52:54:00:00:00:0a"},                         // DHCPv4, hardware type 1
		{"00:03:00:01:52:54:00:00:00:0b", "52:54:00:00:00:0b"},                // DUID-LL
		{"00:01:00:01:2c:5e:1a:2b:52:54:00:00:00:0c", "52:54:00:00:00:0c"},    // DUID-LLT
		{"ff:00:00:00:01:00:03:00:01:52:54:00:00:00:0d", "52:54:00:00:00:0d"}, // RFC 4361 around a DUID-LL
		{"0:3:0:1:52:54:0:0:0:b", "52:54:00:00:00:0b"},                        // libvirt's <host id=...> form
		{"00:03:00:01:52:54:00:00:00:0b:", ""},                                // a stray colon
		{"00:03:00:06:52:54:00:00:00:0b", ""},                                 // DUID-LL of another hardware type
		{"00:03:00:01:52:54:00:00", ""},                                       // too short
		{"00:02:00:00:ab:11:9a:3c", ""},                                       // DUID-EN
		{"hostname-as-id", ""},
		{"", ""},
	} {
		got, ok := macFromClientID(tc.id)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("macFromClientID(%q) = %q, %v; want %q", tc.id, got, ok, tc.want)
		}
	}
}

// The agent lists every interface in the guest; only the NICs of the
// domain carry the node's addresses.
func TestAgentTableKeepsTheDomainsNICs(t *testing.T) {
	ifaces := []libvirt.DomainInterface{
		{Name: "lo", Hwaddr: "00:00:00:00:00:00", Addrs: []libvirt.DomainIPAddress{{Addr: "127.0.0.1"}, {Addr: "::1"}}},
		{Name: "eth0", Hwaddr: "52:54:00:00:00:16", Addrs: []libvirt.DomainIPAddress{{Addr: "10.77.0.5"}, {Addr: "fd00:77::5"}, {Addr: "fe80::5054:ff:fe00:16"}}},
		{Name: "cni0", Hwaddr: "aa:bb:cc:00:00:01", Addrs: []libvirt.DomainIPAddress{{Addr: "10.244.1.1"}, {Addr: "fd10:244:1::1"}}},
		{Name: "kube-ipvs0", Hwaddr: "aa:bb:cc:00:00:02", Addrs: []libvirt.DomainIPAddress{{Addr: "10.96.0.1"}, {Addr: "fd00:96::1"}}},
	}
	a := netip.MustParseAddr
	if got, want := agentTable(ifaces, []string{"52:54:00:00:00:16"}), []netip.Addr{a("10.77.0.5"), a("fd00:77::5")}; !slices.Equal(got, want) {
		t.Errorf("addresses = %v, want the domain NIC's %v", got, want)
	}
	// No NIC with the domain's MAC (changed in the guest): every usable address.
	if got := agentTable(ifaces, []string{"52:54:00:00:00:99"}); len(got) != 6 {
		t.Errorf("addresses without a matching NIC = %v, want all 6 usable ones", got)
	}
}

// Within IPv6, the SLAAC address made from the NIC's MAC comes first: it
// lasts as long as the NIC, while temporary addresses (sorted by value,
// this one would come first) are replaced within a day.
func TestSortAddrsPrefersTheMACsSLAACAddress(t *testing.T) {
	a := netip.MustParseAddr
	got := sortAddrs([]netip.Addr{a("fd00:77::abcd"), a("fd00:77::5054:ff:fe00:16"), a("10.77.0.9"), a("fd00:77::abcd"), a("10.77.0.8")}, "52:54:00:00:00:16")
	want := []netip.Addr{a("10.77.0.8"), a("10.77.0.9"), a("fd00:77::5054:ff:fe00:16"), a("fd00:77::abcd")}
	if !slices.Equal(got, want) {
		t.Errorf("sortAddrs = %v, want %v", got, want)
	}
}
