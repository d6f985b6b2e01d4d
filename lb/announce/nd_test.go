package announce

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/mdlayher/ndp"
)

var (
	vip6      = netip.MustParseAddr("2001:db8::100")
	otherIP6  = netip.MustParseAddr("2001:db8::101")
	clientIP6 = netip.MustParseAddr("2001:db8::50")
)

func mustND(tb testing.TB, m ndp.Message, ethSrc net.HardwareAddr, src netip.Addr, ethDst net.HardwareAddr, dst netip.Addr) []byte {
	tb.Helper()
	b, err := marshalND(m, ethSrc, src, ethDst, dst)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// solicit is a client's multicast solicitation for target, with its
// source link-layer option.
func solicit(tb testing.TB, target netip.Addr) []byte {
	g := solicitedNodeMAC(target)
	return mustND(tb, &ndp.NeighborSolicitation{TargetAddress: target,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: clientMAC}}},
		clientMAC, clientIP6, g[:], solicitedNode(target))
}

func (s *station) sendND(b []byte) {
	s.tb.Helper()
	if _, err := s.nd.WriteTo(b, nil); err != nil {
		s.tb.Fatalf("station write: %v", err)
	}
}

// readND returns the next frame the announcer writes, decoded, or false
// after d.
func (s *station) readND(d time.Duration) (ndFrame, net.HardwareAddr, bool) {
	s.tb.Helper()
	buf := make([]byte, maxNDFrame)
	if err := s.nd.SetReadDeadline(time.Now().Add(d)); err != nil {
		s.tb.Fatal(err)
	}
	n, _, err := s.nd.ReadFrom(buf)
	if err != nil {
		return ndFrame{}, nil, false
	}
	f, err := parseND(buf[:n])
	if err != nil {
		s.tb.Fatalf("the announcer wrote a frame that does not parse: %v", err)
	}
	return f, net.HardwareAddr(bytes.Clone(buf[0:6])), true
}

func advertisement(tb testing.TB, f ndFrame) *ndp.NeighborAdvertisement {
	tb.Helper()
	na, ok := f.msg.(*ndp.NeighborAdvertisement)
	if !ok {
		tb.Fatalf("wrote %T, want a Neighbor Advertisement", f.msg)
	}
	return na
}

func TestParseND(t *testing.T) {
	g := solicitedNodeMAC(vip6)
	valid := solicit(t, vip6)
	corrupt := bytes.Clone(valid)
	corrupt[len(corrupt)-1] ^= 0xff
	hop := bytes.Clone(valid)
	hop[14+7] = 64
	for _, tc := range []struct {
		name  string
		frame []byte
		ok    bool
	}{
		{"multicast solicitation", valid, true},
		{"unicast solicitation without a source option", mustND(t, &ndp.NeighborSolicitation{TargetAddress: vip6}, clientMAC, clientIP6, node1MAC, vip6), true},
		{"duplicate-address probe", mustND(t, &ndp.NeighborSolicitation{TargetAddress: vip6}, rogueMAC, netip.IPv6Unspecified(), g[:], solicitedNode(vip6)), true},
		{"advertisement", mustND(t, &ndp.NeighborAdvertisement{Override: true, TargetAddress: vip6}, rogueMAC, vip6, allNodesMAC, allNodes), true},
		{"probe with a source option", mustND(t, &ndp.NeighborSolicitation{TargetAddress: vip6,
			Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: rogueMAC}}}, rogueMAC, netip.IPv6Unspecified(), g[:], solicitedNode(vip6)), false},
		{"probe not to the target's group", mustND(t, &ndp.NeighborSolicitation{TargetAddress: vip6}, rogueMAC, netip.IPv6Unspecified(), allNodesMAC, allNodes), false},
		{"solicitation for a group", mustND(t, &ndp.NeighborSolicitation{TargetAddress: allNodes}, clientMAC, clientIP6, allNodesMAC, allNodes), false},
		{"solicited advertisement to a group", mustND(t, &ndp.NeighborAdvertisement{Solicited: true, TargetAddress: vip6}, rogueMAC, vip6, allNodesMAC, allNodes), false},
		{"router solicitation", mustND(t, &ndp.RouterSolicitation{}, clientMAC, clientIP6, allNodesMAC, allNodes), false},
		{"solicitation from a group", mustND(t, &ndp.NeighborSolicitation{TargetAddress: vip6}, clientMAC, allNodes, node1MAC, vip6), false},
		{"bad checksum", corrupt, false},
		{"hop limit 64", hop, false},
		{"truncated", valid[:60], false},
		{"empty", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseND(tc.frame)
			if (err == nil) != tc.ok {
				t.Fatalf("parseND: %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestSolicitedNode(t *testing.T) {
	if got, want := solicitedNode(netip.MustParseAddr("2001:db8::12:3456")), netip.MustParseAddr("ff02::1:ff12:3456"); got != want {
		t.Fatalf("solicitedNode = %s, want %s", got, want)
	}
	if got := net.HardwareAddr(func() []byte { m := solicitedNodeMAC(netip.MustParseAddr("2001:db8::12:3456")); return m[:] }()); got.String() != "33:33:ff:12:34:56" {
		t.Fatalf("solicitedNodeMAC = %s", got)
	}
}

// TestAnswersSolicitation: a solicitation for an owned IPv6 VIP, multicast
// or unicast, with or without a source option, gets a solicited advertisement
// with the override flag and the chosen MAC, from that MAC, to the asker.
func TestAnswersSolicitation(t *testing.T) {
	f := newFixture(t, testOptions())
	f.run()
	if err := f.a.Set(vip6, node1MAC); err != nil {
		t.Fatal(err)
	}
	f.st.drainND()
	for _, tc := range []struct {
		name  string
		frame []byte
	}{
		{"multicast with a source option", solicit(t, vip6)},
		{"unicast to the node without a source option", mustND(t, &ndp.NeighborSolicitation{TargetAddress: vip6}, clientMAC, clientIP6, node1MAC, vip6)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.st.sendND(tc.frame)
			got, dst, ok := f.st.readND(time.Second)
			if !ok {
				t.Fatal("no answer")
			}
			na := advertisement(t, got)
			if !na.Solicited || !na.Override || na.Router || na.TargetAddress != vip6 {
				t.Errorf("answer %+v, want S=1 O=1 R=0 for %s", na, vip6)
			}
			if tll := linkLayer(na.Options, ndp.Target); !bytes.Equal(tll, node1MAC) {
				t.Errorf("target link-layer address %s, want node1's %s", tll, node1MAC)
			}
			if !bytes.Equal(got.ethSrc, node1MAC) || !bytes.Equal(dst, clientMAC) || got.src != vip6 || got.dst != clientIP6 {
				t.Errorf("answer %s (%s) -> %s (%s), want %s (%s) -> %s (%s)", got.ethSrc, got.src, dst, got.dst, node1MAC, vip6, clientMAC, clientIP6)
			}
		})
	}
	if n := f.statsEventually(func(s Stats) uint64 { return s.NDReplies }, 2); n != 2 {
		t.Errorf("NDReplies = %d, want 2", n)
	}
	// Nothing for an address it does not own, nor for the node asking
	// about its own VIP.
	f.st.sendND(solicit(t, otherIP6))
	g := solicitedNodeMAC(vip6)
	f.st.sendND(mustND(t, &ndp.NeighborSolicitation{TargetAddress: vip6,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: node1MAC}}}, node1MAC, clientIP6, g[:], solicitedNode(vip6)))
	if got, _, ok := f.st.readND(200 * time.Millisecond); ok {
		t.Fatalf("answered %+v", got.msg)
	}
}

// TestAdvertisesOnSetAndMove: a new IPv6 VIP, and a move, are announced with
// Count unsolicited advertisements (O=1, S=0) to all nodes, and the host
// neighbour entry, the group and promiscuity follow.
func TestAdvertisesOnSetAndMove(t *testing.T) {
	f := newFixture(t, testOptions())
	f.run()
	for _, mac := range []net.HardwareAddr{node1MAC, node2MAC} {
		if err := f.a.Set(vip6, mac); err != nil {
			t.Fatal(err)
		}
		for i := range testOptions().Count {
			got, dst, ok := f.st.readND(time.Second)
			if !ok {
				t.Fatalf("advertisement %d for %s not written", i, mac)
			}
			na := advertisement(t, got)
			if na.Solicited || !na.Override || na.TargetAddress != vip6 || !bytes.Equal(linkLayer(na.Options, ndp.Target), mac) {
				t.Fatalf("advertisement %+v, want unsolicited, override, %s at %s", na, vip6, mac)
			}
			if !bytes.Equal(dst, allNodesMAC) || got.dst != allNodes || !bytes.Equal(got.ethSrc, mac) {
				t.Fatalf("advertisement to %s (%s) from %s", dst, got.dst, got.ethSrc)
			}
		}
		if n, ok := f.neigh.get(vip6); !ok || !bytes.Equal(n.HardwareAddr, mac) {
			t.Fatalf("host neighbour entry %+v, want %s", n, mac)
		}
	}
	if !f.st.ndBridge.promisc.Load() {
		t.Error("not promiscuous with an IPv6 VIP owned")
	}
	if err := f.a.Remove(vip6); err != nil {
		t.Fatal(err)
	}
	if f.st.ndBridge.promisc.Load() {
		t.Error("still promiscuous with no IPv6 VIP owned")
	}
	if _, ok := f.neigh.get(vip6); ok {
		t.Error("host neighbour entry left after Remove")
	}
}

// TestDefendsAgainstProbe: another host's duplicate-address probe for an
// owned VIP is answered to all nodes, counted and reported.
func TestDefendsAgainstProbe(t *testing.T) {
	reported := make(chan string, 1)
	opts := testOptions()
	opts.OnDefend = func(d Defence) {
		select { // a second defence (Defended counts it) must not block the responder
		case reported <- d.VIP.String() + " " + d.From.String():
		default:
		}
	}
	f := newFixture(t, opts)
	f.run()
	if err := f.a.Set(vip6, node1MAC); err != nil {
		t.Fatal(err)
	}
	f.st.drainND()
	g := solicitedNodeMAC(vip6)
	f.st.sendND(mustND(t, &ndp.NeighborSolicitation{TargetAddress: vip6}, rogueMAC, netip.IPv6Unspecified(), g[:], solicitedNode(vip6)))
	got, dst, ok := f.st.readND(time.Second)
	if !ok {
		t.Fatal("the probe was not answered")
	}
	na := advertisement(t, got)
	if na.Solicited || !na.Override || !bytes.Equal(dst, allNodesMAC) || !bytes.Equal(linkLayer(na.Options, ndp.Target), node1MAC) {
		t.Fatalf("defence %+v to %s, want an unsolicited override to all nodes with %s", na, dst, node1MAC)
	}
	if n := f.statsEventually(func(s Stats) uint64 { return s.Defended }, 1); n != 1 {
		t.Errorf("Defended = %d, want 1", n)
	}
	// The report follows the advertisement on the wire and the count.
	select {
	case r := <-reported:
		if want := vip6.String() + " " + rogueMAC.String(); r != want {
			t.Errorf("OnDefend told %q, want %q", r, want)
		}
	case <-time.After(time.Second):
		t.Error("OnDefend was not told")
	}
}

// TestProbeIPv6: a duplicate-address probe finds an address another host
// advertises, and none where nobody answers.
func TestProbeIPv6(t *testing.T) {
	f := newFixture(t, testOptions())
	f.run()
	go func() {
		got, _, ok := f.st.readND(time.Second)
		if !ok {
			return
		}
		if ns, isNS := got.msg.(*ndp.NeighborSolicitation); isNS && got.src.IsUnspecified() && ns.TargetAddress == otherIP6 {
			f.st.sendND(mustND(t, &ndp.NeighborAdvertisement{Override: true, TargetAddress: otherIP6,
				Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: rogueMAC}}}, rogueMAC, otherIP6, allNodesMAC, allNodes))
		}
	}()
	owner, taken, err := f.a.Probe(context.Background(), otherIP6)
	if err != nil || !taken || !bytes.Equal(owner, rogueMAC) {
		t.Fatalf("Probe(%s) = %s, %v, %v; want the rogue's %s", otherIP6, owner, taken, err, rogueMAC)
	}
	if _, taken, err := f.a.Probe(context.Background(), vip6); err != nil || taken {
		t.Fatalf("Probe(%s) = taken %v, %v; want free", vip6, taken, err)
	}
}

func (s *station) drainND() {
	for {
		if _, _, ok := s.readND(100 * time.Millisecond); !ok {
			return
		}
	}
}

// FuzzHandleND feeds arbitrary frames to the neighbour-discovery responder:
// it writes at most one frame, and only an advertisement of the owned VIP
// at the chosen MAC, to a unicast MAC: the one group it writes to is all
// nodes, with an unsolicited advertisement in the VIP's defence, at most
// once per DefendInterval.
func FuzzHandleND(f *testing.F) {
	g := solicitedNodeMAC(vip6)
	f.Add(solicit(f, vip6))
	f.Add(mustND(f, &ndp.NeighborSolicitation{TargetAddress: vip6,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}}},
		clientMAC, clientIP6, g[:], solicitedNode(vip6)))
	f.Add(solicit(f, otherIP6))
	f.Add(mustND(f, &ndp.NeighborSolicitation{TargetAddress: vip6}, clientMAC, clientIP6, node1MAC, vip6))
	f.Add(mustND(f, &ndp.NeighborSolicitation{TargetAddress: vip6}, rogueMAC, netip.IPv6Unspecified(), g[:], solicitedNode(vip6)))
	f.Add(mustND(f, &ndp.NeighborAdvertisement{Override: true, TargetAddress: vip6}, rogueMAC, vip6, allNodesMAC, allNodes))
	f.Add([]byte{})

	nd := &recordND{}
	a, err := NewWithConns(&net.Interface{Index: 7, Name: "br-fuzz", HardwareAddr: bridgeMAC}, Conns{ARP: &recordConn{}, ND: nd}, newFakeNeighbours(), testOptions())
	if err != nil {
		f.Fatal(err)
	}
	if err := a.Set(vip6, node1MAC); err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	start, defences := time.Now(), 0
	f.Fuzz(func(t *testing.T, b []byte) {
		nd.take()
		fixChecksum(b)
		if fr, err := parseND(b); err == nil {
			a.handleND(ctx, fr)
		}
		frames := nd.take()
		if len(frames) > 1 {
			t.Fatalf("%d frames written for one frame read", len(frames))
		}
		for _, w := range frames {
			got, err := parseND(w)
			if err != nil {
				t.Fatalf("wrote a frame that does not parse: %v", err)
			}
			na, ok := got.msg.(*ndp.NeighborAdvertisement)
			if !ok || na.TargetAddress != vip6 || !na.Override || !bytes.Equal(linkLayer(na.Options, ndp.Target), node1MAC) || !bytes.Equal(got.ethSrc, node1MAC) {
				t.Fatalf("wrote %+v from %s", got.msg, got.ethSrc)
			}
			dst := net.HardwareAddr(w[0:6])
			if dst[0]&1 == 0 {
				continue
			}
			if !bytes.Equal(dst, allNodesMAC) || got.dst != allNodes || na.Solicited {
				t.Fatalf("wrote %+v to %s (%s)", na, dst, got.dst)
			}
			defences++
			if limit := 1 + int(time.Since(start)/DefendInterval); defences > limit {
				t.Fatalf("%d defences in %v", defences, time.Since(start))
			}
		}
	})
}

// fixChecksum makes a frame's ICMPv6 checksum right, where its lengths
// allow, so that fuzzing reaches past the checksum.
func fixChecksum(b []byte) {
	if len(b) < ethHeaderLen+ipv6HeaderLen+4 {
		return
	}
	ip := b[ethHeaderLen:]
	plen := int(ip[4])<<8 | int(ip[5])
	if plen < 4 || ipv6HeaderLen+plen > len(ip) {
		return
	}
	icmp := ip[ipv6HeaderLen : ipv6HeaderLen+plen]
	icmp[2], icmp[3] = 0, 0
	sum := checksum(netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40])), icmp)
	icmp[2], icmp[3] = byte(sum>>8), byte(sum)
}
