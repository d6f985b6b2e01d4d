package lanprobe

import (
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"golang.org/x/sys/unix"
)

// Frame is one frame seen on the LAN: when it arrived, the address it is
// about, the MAC it names for it and, for ARP, its operation.
type Frame struct {
	At  time.Time
	IP  netip.Addr
	MAC net.HardwareAddr
	Op  arp.Operation // 0 for a Neighbor Advertisement
}

// Announcement reads an Ethernet frame: whether it announces an address
// unasked, as a gratuitous ARP (request or reply form: sender and target
// address are both the announced one) or an unsolicited Neighbor
// Advertisement with the override flag, and what it says (At is left
// zero).
func Announcement(b []byte) (Frame, bool) {
	var f ethernet.Frame
	if err := f.UnmarshalBinary(b); err != nil {
		return Frame{}, false
	}
	switch f.EtherType {
	case ethernet.EtherTypeARP:
		var p arp.Packet
		if err := p.UnmarshalBinary(f.Payload); err != nil || p.SenderIP != p.TargetIP {
			return Frame{}, false
		}
		return Frame{IP: p.SenderIP, MAC: p.SenderHardwareAddr, Op: p.Operation}, true
	case ethernet.EtherTypeIPv6:
		const ipv6Header = 40
		if len(f.Payload) < ipv6Header || f.Payload[6] != unix.IPPROTO_ICMPV6 {
			return Frame{}, false
		}
		m, err := ndp.ParseMessage(f.Payload[ipv6Header:])
		na, ok := m.(*ndp.NeighborAdvertisement)
		if err != nil || !ok || na.Solicited || !na.Override {
			return Frame{}, false
		}
		for _, o := range na.Options {
			if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Target {
				return Frame{IP: na.TargetAddress, MAC: lla.Addr}, true
			}
		}
	}
	return Frame{}, false
}
