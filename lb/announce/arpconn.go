package announce

import (
	"net"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
)

// arpConn is ARP over a packet socket. *arp.Client would do, but it
// insists on an IPv4 address on the bridge, which an IPv6-only bridge
// does not have and nothing here needs.
type arpConn struct {
	pc *packet.Conn
}

// Read returns a packet and frame of their own: both point into the buffer
// they were read into, and a request kept for a hand-over outlives the
// next Read.
func (c *arpConn) Read() (*arp.Packet, *ethernet.Frame, error) {
	for {
		buf := make([]byte, 128)
		n, _, err := c.pc.ReadFrom(buf)
		if err != nil {
			return nil, nil, err
		}
		var f ethernet.Frame
		if err := f.UnmarshalBinary(buf[:n]); err != nil || f.EtherType != ethernet.EtherTypeARP {
			continue
		}
		p := new(arp.Packet)
		if err := p.UnmarshalBinary(f.Payload); err != nil {
			continue
		}
		return p, &f, nil
	}
}

func (c *arpConn) WriteTo(p *arp.Packet, addr net.HardwareAddr) error {
	pb, err := p.MarshalBinary()
	if err != nil {
		return err
	}
	fb, err := (&ethernet.Frame{Destination: addr, Source: p.SenderHardwareAddr, EtherType: ethernet.EtherTypeARP, Payload: pb}).MarshalBinary()
	if err != nil {
		return err
	}
	_, err = c.pc.WriteTo(fb, &packet.Addr{HardwareAddr: addr})
	return err
}

func (c *arpConn) SetReadDeadline(t time.Time) error { return c.pc.SetReadDeadline(t) }
func (c *arpConn) Close() error                      { return c.pc.Close() }
