package libvirtd

import (
	"strings"
	"testing"
)

// Guests name the cluster DNS as their resolver only if DHCP hands it
// out: dnsmasq, serving no DNS itself, names no server of its own.
func TestNetworkHandsOutDNS(t *testing.T) {
	n := Network{Name: "n", Bridge: "br", IPv4Prefix: "10.123.0", DHCPFirst: 100, DHCPLast: 199}
	x, err := n.XML()
	if err != nil || strings.Contains(x, "dns-server") {
		t.Fatalf("without DNS: %v\n%s", err, x)
	}
	n.DNS = "10.123.0.1"
	if x, err = n.XML(); err != nil || !strings.Contains(x, `<dnsmasq:option value="dhcp-option=option:dns-server,10.123.0.1"></dnsmasq:option>`) {
		t.Errorf("with DNS 10.123.0.1: %v\n%s", err, x)
	}
}
