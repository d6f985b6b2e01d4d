package lanprobe

import (
	"net"
	"net/netip"
	"testing"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"golang.org/x/sys/unix"
)

func ethernetFrame(t *testing.T, src net.HardwareAddr, et ethernet.EtherType, payload []byte) []byte {
	t.Helper()
	b, err := (&ethernet.Frame{Destination: ethernet.Broadcast, Source: src, EtherType: et, Payload: payload}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// arpFrame is an ARP packet from mac (sender address sip) to tip at tha,
// in a frame of EtherType et.
func arpFrame(t *testing.T, op arp.Operation, mac net.HardwareAddr, sip, tip netip.Addr, tha net.HardwareAddr, et ethernet.EtherType) []byte {
	t.Helper()
	p, err := arp.NewPacket(op, mac, sip, tha, tip)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := p.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return ethernetFrame(t, mac, et, pb)
}

// naFrame is a Neighbor Advertisement from mac for target.
func naFrame(t *testing.T, mac net.HardwareAddr, target netip.Addr, solicited, override bool) []byte {
	t.Helper()
	m := &ndp.NeighborAdvertisement{Solicited: solicited, Override: override, TargetAddress: target,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: mac}}}
	icmp, err := ndp.MarshalMessageChecksum(m, target, netip.MustParseAddr("ff02::1"))
	if err != nil {
		t.Fatal(err)
	}
	ip := make([]byte, 40, 40+len(icmp))
	ip[0], ip[5], ip[6], ip[7] = 6<<4, byte(len(icmp)), unix.IPPROTO_ICMPV6, 255
	return ethernetFrame(t, mac, ethernet.EtherTypeIPv6, append(ip, icmp...))
}

// Announcement accepts both forms of a gratuitous ARP for the VIP, and an
// unsolicited override advertisement for an IPv6 VIP, and nothing else.
func TestAnnouncement(t *testing.T) {
	vip, vip6 := netip.MustParseAddr("10.0.0.100"), netip.MustParseAddr("fd00::100")
	node, _ := net.ParseMAC("02:00:00:00:00:01")
	client, _ := net.ParseMAC("02:00:00:00:00:02")
	bcast := ethernet.Broadcast
	clientIP := netip.MustParseAddr("10.0.0.5")
	for _, tc := range []struct {
		name  string
		frame []byte
		vip   netip.Addr
		want  bool
	}{
		{"request form", arpFrame(t, arp.OperationRequest, node, vip, vip, bcast, ethernet.EtherTypeARP), vip, true},
		{"reply form", arpFrame(t, arp.OperationReply, node, vip, vip, bcast, ethernet.EtherTypeARP), vip, true},
		{"an answer to a client", arpFrame(t, arp.OperationReply, node, vip, clientIP, client, ethernet.EtherTypeARP), vip, false},
		{"a client asking", arpFrame(t, arp.OperationRequest, node, clientIP, vip, bcast, ethernet.EtherTypeARP), vip, false},
		{"another VIP", arpFrame(t, arp.OperationRequest, node, clientIP, clientIP, bcast, ethernet.EtherTypeARP), vip, false},
		{"not ARP", arpFrame(t, arp.OperationRequest, node, vip, vip, bcast, ethernet.EtherTypeIPv4), vip, false},
		{"truncated", arpFrame(t, arp.OperationRequest, node, vip, vip, bcast, ethernet.EtherTypeARP)[:20], vip, false},
		{"unsolicited advertisement", naFrame(t, node, vip6, false, true), vip6, true},
		{"solicited answer", naFrame(t, node, vip6, true, true), vip6, false},
		{"advertisement without override", naFrame(t, node, vip6, false, false), vip6, false},
		{"advertisement of another VIP", naFrame(t, node, vip6.Next(), false, true), vip6, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, ok := Announcement(tc.frame)
			got, mac := ok && f.IP == tc.vip, f.MAC
			if got != tc.want {
				t.Fatalf("announcement = %v, want %v", got, tc.want)
			}
			if got && mac.String() != node.String() {
				t.Errorf("names %s, want %s", mac, node)
			}
		})
	}
}
