package libvirtcloud

import (
	"encoding/hex"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"libvirt.org/go/libvirt"
)

// Reading libvirt's DHCP leases of both families. libvirt records a
// DHCPv6 lease only when dnsmasq tells it the client's MAC (DNSMASQ_MAC),
// so Mac is set for IPv6 too; the DUID goes to Clientid and the IAID to
// Iaid, neither of which names a NIC. dnsmasq may prefix a MAC with its
// hardware type ("01-52:54:.."). A lease whose MAC does not parse is
// matched by the MAC in its client identifier (DHCPv4 type 1) or
// link-layer DUID (DUID-LLT, DUID-LL; bare for DHCPv6, inside an RFC 4361
// identifier for DHCPv4); failing that it is nobody's.

// leaseTable maps each lease's MAC (lower case) to its addresses.
func leaseTable(leases []libvirt.NetworkDHCPLease, out map[string][]netip.Addr) {
	for _, l := range leases {
		ip, err := netip.ParseAddr(l.IPaddr)
		if err != nil || !usable(ip.Unmap()) {
			continue
		}
		if mac, ok := leaseMAC(l); ok {
			out[mac] = append(out[mac], ip.Unmap())
		}
	}
}

// leaseMAC is the MAC of the interface that holds l, lower case.
func leaseMAC(l libvirt.NetworkDHCPLease) (string, bool) {
	if mac, ok := parseLeaseMAC(l.Mac); ok {
		return mac, true
	}
	return macFromClientID(l.Clientid)
}

// parseLeaseMAC reads a 6-byte MAC as dnsmasq prints it: "52:54:00:..",
// possibly with a hardware type prefix ("01-52:54:00:..").
func parseLeaseMAC(s string) (string, bool) {
	s = strings.TrimSpace(s)
	if typ, rest, ok := strings.Cut(s, "-"); ok && len(typ) == 2 {
		if typ != "01" { // 1 is Ethernet; other types name no guest NIC
			return "", false
		}
		s = rest
	}
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		return "", false
	}
	return hw.String(), true
}

// macFromClientID finds the Ethernet MAC in a DHCP client identifier or
// DUID, given in hex: bytes separated by colons (dnsmasq's "00:03:..", or
// libvirt's host id form "0:3:..") or not separated at all.
func macFromClientID(s string) (string, bool) {
	b, ok := hexBytes(strings.TrimSpace(s))
	if !ok || len(b) == 0 {
		return "", false
	}
	switch {
	case b[0] == 1 && len(b) == 7: // DHCPv4: hardware type 1, then the MAC
		return net.HardwareAddr(b[1:]).String(), true
	case b[0] == 0xff && len(b) > 5: // RFC 4361: 0xff, IAID (4 bytes), DUID
		b = b[5:]
	}
	if len(b) < 4 || b[2] != 0 || b[3] != 1 { // DUID type, then hardware type 1
		return "", false
	}
	var ll []byte
	switch {
	case b[0] == 0 && b[1] == 1 && len(b) == 14: // DUID-LLT: type, hw type, time, MAC
		ll = b[8:]
	case b[0] == 0 && b[1] == 3 && len(b) == 10: // DUID-LL: type, hw type, MAC
		ll = b[4:]
	default:
		return "", false
	}
	return net.HardwareAddr(ll).String(), true
}

func hexBytes(s string) ([]byte, bool) {
	if !strings.Contains(s, ":") {
		b, err := hex.DecodeString(s)
		return b, err == nil
	}
	parts := strings.Split(s, ":")
	b := make([]byte, len(parts))
	for i, p := range parts {
		v, err := strconv.ParseUint(p, 16, 8)
		if err != nil {
			return nil, false
		}
		b[i] = byte(v)
	}
	return b, true
}
