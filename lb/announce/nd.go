package announce

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/metrics"
)

// IPv6 VIPs are resolved with neighbour discovery (RFC 4861), read from a
// packet socket on the bridge as ARP is: it needs no address on the bridge,
// link-local included, and it sees unicast solicitations (a client's
// reachability probe) as well as multicast ones. Answers are solicited
// advertisements with the override flag, so that a client still holding
// the old MAC takes the new one.

const (
	maxNDFrame     = 1518
	ethHeaderLen   = 14
	ipv6HeaderLen  = 40
	ndHopLimit     = 255 // RFC 4861 §7.1: anything else came through a router
	minNDMessage   = 24  // type, code, checksum, flags, target
	icmpv6Protocol = 58
)

var (
	allNodes    = netip.MustParseAddr("ff02::1")
	allNodesMAC = net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}
)

// ndFrame is a neighbour-discovery message read from the bridge.
type ndFrame struct {
	ethSrc   net.HardwareAddr
	src, dst netip.Addr
	msg      ndp.Message // *ndp.NeighborSolicitation or *ndp.NeighborAdvertisement
}

// parseND decodes a frame and checks it as RFC 4861 §7.1.1 and §7.1.2 ask
// a receiver to; anything else is an error.
func parseND(b []byte) (ndFrame, error) {
	if len(b) < ethHeaderLen+ipv6HeaderLen+minNDMessage {
		return ndFrame{}, errors.New("frame too short")
	}
	if binary.BigEndian.Uint16(b[12:14]) != uint16(ethernet.EtherTypeIPv6) {
		return ndFrame{}, errors.New("not IPv6")
	}
	ip := b[ethHeaderLen:]
	if ip[0]>>4 != 6 || ip[6] != icmpv6Protocol || ip[7] != ndHopLimit {
		return ndFrame{}, errors.New("not ICMPv6 with hop limit 255")
	}
	plen := int(binary.BigEndian.Uint16(ip[4:6]))
	if plen < minNDMessage || ipv6HeaderLen+plen > len(ip) {
		return ndFrame{}, fmt.Errorf("payload length %d", plen)
	}
	f := ndFrame{
		ethSrc: net.HardwareAddr(bytes.Clone(b[6:12])),
		src:    netip.AddrFrom16([16]byte(ip[8:24])),
		dst:    netip.AddrFrom16([16]byte(ip[24:40])),
	}
	if f.src.IsMulticast() {
		return ndFrame{}, errors.New("multicast source address")
	}
	icmp := ip[ipv6HeaderLen : ipv6HeaderLen+plen]
	if icmp[1] != 0 {
		return ndFrame{}, errors.New("ICMPv6 code is not 0")
	}
	if checksum(f.src, f.dst, icmp) != 0 {
		return ndFrame{}, errors.New("bad ICMPv6 checksum")
	}
	m, err := ndp.ParseMessage(icmp)
	if err != nil {
		return ndFrame{}, err
	}
	f.msg = m
	switch m := m.(type) {
	case *ndp.NeighborSolicitation:
		if m.TargetAddress.IsMulticast() {
			return ndFrame{}, errors.New("solicitation for a multicast target")
		}
		if f.src.IsUnspecified() && (f.dst != solicitedNode(m.TargetAddress) || linkLayer(m.Options, ndp.Source) != nil) {
			return ndFrame{}, errors.New("malformed duplicate-address probe")
		}
	case *ndp.NeighborAdvertisement:
		if m.TargetAddress.IsMulticast() || f.dst.IsMulticast() && m.Solicited {
			return ndFrame{}, errors.New("malformed advertisement")
		}
	default:
		return ndFrame{}, fmt.Errorf("unexpected %v", m.Type())
	}
	return f, nil
}

// checksum is the ones' complement sum of the IPv6 pseudo-header and an
// ICMPv6 message: 0 for a message whose checksum is right.
func checksum(src, dst netip.Addr, icmp []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for len(b) >= 2 {
			sum += uint32(binary.BigEndian.Uint16(b))
			b = b[2:]
		}
		if len(b) == 1 {
			sum += uint32(b[0]) << 8
		}
	}
	s, d := src.As16(), dst.As16()
	add(s[:])
	add(d[:])
	sum += uint32(len(icmp)) + icmpv6Protocol
	add(icmp)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// linkLayer returns the link-layer address option of direction d, if any.
func linkLayer(opts []ndp.Option, d ndp.Direction) net.HardwareAddr {
	for _, o := range opts {
		if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == d && len(lla.Addr) == 6 {
			return lla.Addr
		}
	}
	return nil
}

// readND reads and handles one neighbour-discovery frame; buf is the
// reader's own.
func (a *Announcer) readND(ctx context.Context, b *incarnation, buf []byte) error {
	n, _, err := b.ND.ReadFrom(buf)
	if err != nil {
		return err
	}
	if f, err := parseND(buf[:n]); err == nil {
		a.handleND(ctx, f)
	}
	return nil
}

// handleND wakes probes waiting for the target, defends owned VIPs against
// other hosts' claims, and answers solicitations for owned VIPs.
func (a *Announcer) handleND(ctx context.Context, f ndFrame) {
	if f.ethSrc[0]&1 != 0 || bytes.Equal(f.ethSrc, a.bridge.Load().mac) {
		return // a group never sends; the bridge is us
	}
	switch m := f.msg.(type) {
	case *ndp.NeighborAdvertisement:
		from := linkLayer(m.Options, ndp.Target)
		if from == nil {
			from = f.ethSrc
		}
		if a.sincere(from, f.ethSrc) {
			a.claimed(m.TargetAddress, from)
		}
		a.contest(ctx, m.TargetAddress, from, false)
	case *ndp.NeighborSolicitation:
		if f.src.IsUnspecified() {
			a.claimed(m.TargetAddress, f.ethSrc) // another host's probe
			a.contest(ctx, m.TargetAddress, f.ethSrc, true)
			return
		}
		// Its target learns the sender's MAC for its source (RFC 4861 §7.2.3).
		from := linkLayer(m.Options, ndp.Source)
		if from == nil {
			from = f.ethSrc
		}
		a.contest(ctx, f.src, from, false)
		if a.handover.keep(func() { a.answerND(ctx, f, m) }) {
			return // inactive: SetActive may answer it
		}
		a.answerND(ctx, f, m)
	}
}

// answerND answers a solicitation for an owned VIP with the chosen MAC,
// to the asker's MAC: never to a group, so that nobody can make the
// announcer reflect frames at every station.
func (a *Announcer) answerND(ctx context.Context, f ndFrame, ns *ndp.NeighborSolicitation) {
	vip := ns.TargetAddress
	asker := linkLayer(ns.Options, ndp.Source)
	if asker == nil {
		asker = f.ethSrc // RFC 4861 §7.2.4 lets a unicast solicitation omit it; handleND saw it is unicast
	}
	if asker[0]&1 != 0 {
		// A group never sends, so the frame is forged or broken. It gets
		// nothing, as an ARP packet with a group sender does, rather than
		// a unicast answer to its Ethernet source: a frame that lies
		// about its sender is no question worth answering.
		return
	}
	a.wireMu.RLock()
	defer a.wireMu.RUnlock()
	c, ok := a.table()[vip]
	if !ok || bytes.Equal(asker, c.mac) {
		return
	}
	na := &ndp.NeighborAdvertisement{Solicited: true, Override: true, TargetAddress: vip,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: c.mac}}}
	if err := a.writeND(na, c.mac, vip, asker, f.src); err != nil {
		a.stats.writeErrors.Add(1)
		klog.FromContext(ctx).V(2).Info("Answering a Neighbor Solicitation", "vip", vip, "to", asker, "err", err)
		return
	}
	a.stats.ndReplies.Add(1)
	metrics.NDPReplies.Inc()
}

// advertise writes an unsolicited advertisement for vip from mac to all
// nodes, overriding what they hold. Callers hold wireMu for reading.
func (a *Announcer) advertise(vip netip.Addr, mac net.HardwareAddr) error {
	na := &ndp.NeighborAdvertisement{Override: true, TargetAddress: vip,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: mac}}}
	if err := a.writeND(na, mac, vip, allNodesMAC, allNodes); err != nil {
		a.stats.writeErrors.Add(1)
		return err
	}
	return nil
}

// sendNDProbe writes a duplicate-address probe for vip (RFC 4862 §5.4.2)
// from the bridge's own MAC: an unspecified source, to vip's group.
func (a *Announcer) sendNDProbe(vip netip.Addr) error {
	mac := a.bridge.Load().mac
	g := solicitedNodeMAC(vip)
	err := a.writeND(&ndp.NeighborSolicitation{TargetAddress: vip}, mac, netip.IPv6Unspecified(), g[:], solicitedNode(vip))
	if err != nil {
		a.stats.writeErrors.Add(1)
	}
	return err
}

// writeND writes m in an IPv6 packet from src to dst, in an Ethernet frame
// from ethSrc to ethDst.
func (a *Announcer) writeND(m ndp.Message, ethSrc net.HardwareAddr, src netip.Addr, ethDst net.HardwareAddr, dst netip.Addr) error {
	frame, err := marshalND(m, ethSrc, src, ethDst, dst)
	if err != nil {
		return err
	}
	_, err = a.bridge.Load().ND.WriteTo(frame, &packet.Addr{HardwareAddr: ethDst})
	return err
}

// marshalND is the frame writeND writes.
func marshalND(m ndp.Message, ethSrc net.HardwareAddr, src netip.Addr, ethDst net.HardwareAddr, dst netip.Addr) ([]byte, error) {
	icmp, err := ndp.MarshalMessageChecksum(m, src, dst)
	if err != nil {
		return nil, err
	}
	frame := make([]byte, ethHeaderLen+ipv6HeaderLen+len(icmp))
	copy(frame[0:6], ethDst)
	copy(frame[6:12], ethSrc)
	binary.BigEndian.PutUint16(frame[12:14], uint16(ethernet.EtherTypeIPv6))
	ip := frame[ethHeaderLen:]
	ip[0] = 6 << 4
	binary.BigEndian.PutUint16(ip[4:6], uint16(len(icmp)))
	ip[6], ip[7] = icmpv6Protocol, ndHopLimit
	s, d := src.As16(), dst.As16()
	copy(ip[8:24], s[:])
	copy(ip[24:40], d[:])
	copy(ip[ipv6HeaderLen:], icmp)
	return frame, nil
}
