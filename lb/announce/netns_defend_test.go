package announce

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"golang.org/x/sys/unix"
)

// Hostile frames from the lab's namespaces: what a LAN peer can make the
// announcer send, and how often.

// ndSocket opens a packet socket for IPv6 frames on eth0 in p's namespace,
// to write frames as they are given and read what p's port delivers.
func (l *lab) ndSocket(p labPeer) *packet.Conn {
	l.tb.Helper()
	var c *packet.Conn
	l.check(inNamespace(p.ns, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		c, err = packet.Listen(ifi, packet.Raw, unix.ETH_P_IPV6, nil)
		return err
	}), "ND socket")
	l.cleanup(func() { c.Close() })
	return c
}

// sendFrame writes a whole Ethernet frame on c.
func (l *lab) sendFrame(c *packet.Conn, frame []byte) {
	l.tb.Helper()
	_, err := c.WriteTo(frame, &packet.Addr{HardwareAddr: net.HardwareAddr(frame[0:6])})
	l.check(err, "writing a frame")
}

// seenNA is a Neighbor Advertisement read off the wire.
type seenNA struct {
	ndFrame
	na     *ndp.NeighborAdvertisement
	ethDst net.HardwareAddr
}

// advertisementsOf reads c for d and returns the Neighbor Advertisements
// for vip it carried, from any MAC to any.
func advertisementsOf(tb testing.TB, c *packet.Conn, vip netip.Addr, d time.Duration) []seenNA {
	tb.Helper()
	var out []seenNA
	buf := make([]byte, maxNDFrame)
	if err := c.SetReadDeadline(time.Now().Add(d)); err != nil {
		tb.Fatal(err)
	}
	for {
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			if !isTimeout(err) {
				tb.Fatalf("reading advertisements: %v", err)
			}
			return out
		}
		f, err := parseND(buf[:n])
		if err != nil {
			continue
		}
		if na, ok := f.msg.(*ndp.NeighborAdvertisement); ok && na.TargetAddress == vip {
			out = append(out, seenNA{f, na, net.HardwareAddr(bytes.Clone(buf[0:6]))})
		}
	}
}

// settled waits for the burst that announced the VIPs to end.
func (l *lab) settled(count func(Stats) uint64, want uint64) {
	l.tb.Helper()
	if _, ok := waitFor(3*time.Second, func() bool { return count(l.a.Stats()) >= want }); !ok {
		l.tb.Fatalf("the first burst did not end: %+v", l.a.Stats())
	}
	time.Sleep(l.a.opts.Interval) // its last frame may still be on its way
}

// TestNetnsIPv6NoAdvertisementToGroupOption: a Neighbor Solicitation whose
// source link-layer option is a group address (broadcast: the frame
// acceptance/hostile.sh sends) gets no advertisement at all, so none to
// the group: a host can never use the announcer to reflect frames at
// every station. The same solicitation naming the client's own MAC is
// answered, to that MAC.
func TestNetnsIPv6NoAdvertisementToGroupOption(t *testing.T) {
	l := newLab(t, labOptions())
	l.check(l.a.Set(labVIP6, labNodeMAC[0]), "Set")
	l.settled(func(s Stats) uint64 { return s.Advertisements }, uint64(l.a.opts.Count))
	c := l.ndSocket(l.client)
	g := solicitedNodeMAC(labVIP6)
	ns := func(lla net.HardwareAddr) []byte {
		return mustND(t, &ndp.NeighborSolicitation{TargetAddress: labVIP6,
			Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: lla}}},
			labClientMAC, v6(l.client.ip), g[:], solicitedNode(labVIP6))
	}
	for _, group := range []net.HardwareAddr{ethernet.Broadcast, allNodesMAC} {
		for range 3 {
			l.sendFrame(c, ns(group))
			for _, s := range advertisementsOf(t, c, labVIP6, 400*time.Millisecond) {
				t.Errorf("a solicitation with source option %s got an advertisement %s -> %s", group, s.ethSrc, s.ethDst)
			}
		}
	}
	l.sendFrame(c, ns(labClientMAC))
	seen := advertisementsOf(t, c, labVIP6, 400*time.Millisecond)
	if len(seen) != 1 || !bytes.Equal(seen[0].ethDst, labClientMAC) || !seen[0].na.Solicited {
		t.Fatalf("the client's own solicitation got %d advertisements (%+v), want one to %s", len(seen), seen, labClientMAC)
	}
	if got := l.a.Stats().NDReplies; got != 1 {
		t.Errorf("NDReplies = %d, want 1", got)
	}
}
