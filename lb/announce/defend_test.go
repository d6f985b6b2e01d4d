package announce

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
)

// TestGuard: one claim is answered per DefendInterval, from the first;
// the ones between are counted and handed to the next answered one.
func TestGuard(t *testing.T) {
	var g guard
	t0 := time.Unix(1_700_000_000, 0)
	for _, step := range []struct {
		at      time.Duration
		due     bool
		ignored uint64
	}{
		{0, true, 0},
		{time.Millisecond, false, 0},
		{DefendInterval - time.Nanosecond, false, 0},
		{DefendInterval, true, 2},
		{DefendInterval + time.Second, false, 0},
		{3 * DefendInterval, true, 1},
		{4 * DefendInterval, true, 0},
	} {
		ignored, due := g.due(t0.Add(step.at))
		if due != step.due || ignored != step.ignored {
			t.Errorf("claim at +%v: due %v, %d ignored before; want %v, %d", step.at, due, ignored, step.due, step.ignored)
		}
	}
}

// defending is a running fixture whose defences are reported on the
// channel returned.
func defending(t *testing.T) (*fixture, chan Defence) {
	reports := make(chan Defence, 10)
	opts := testOptions()
	opts.OnDefend = func(d Defence) { reports <- d }
	f := newFixture(t, opts)
	f.run()
	return f, reports
}

// TestDefendsAgainstClaims: an ARP packet naming a stranger's MAC for an
// owned VIP is answered at once with a gratuitous round from the chosen
// MAC, reported once; later claims within DefendInterval are counted and
// answered with nothing. Packets from the bridge or from a node that
// answers an owned VIP are no claims.
func TestDefendsAgainstClaims(t *testing.T) {
	f, reports := defending(t)
	if err := f.a.Set(otherIP, node2MAC); err != nil {
		t.Fatal(err)
	}
	f.settle(otherIP, node2MAC)
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	f.settle(vip, node1MAC)

	for _, mac := range []net.HardwareAddr{node1MAC, node2MAC, bridgeMAC} {
		f.st.send(arpPacket(arp.OperationRequest, mac, vip, zeroMAC, vip), ethernet.Broadcast)
		f.st.send(arpPacket(arp.OperationReply, mac, vip, clientMAC, clientIP), clientMAC)
	}
	// The segment keeps order: the first frames back answer the stranger.
	f.st.send(arpPacket(arp.OperationReply, rogueMAC, vip, clientMAC, clientIP), clientMAC)
	f.st.gratuitous(vip, node1MAC, 2, wait)
	for _, p := range []*arp.Packet{
		arpPacket(arp.OperationRequest, rogueMAC, vip, zeroMAC, vip),
		arpPacket(arp.OperationReply, rogueMAC, vip, ethernet.Broadcast, vip),
		arpPacket(arp.OperationRequest, rogueMAC, vip, zeroMAC, clientIP),
	} {
		f.st.send(p, ethernet.Broadcast)
	}
	f.st.request(vip)
	if p, _ := f.st.next(wait); p.Operation != arp.OperationReply || p.TargetIP != clientIP {
		t.Fatalf("after more claims, %v %s is-at %s to %s; want only the answer to the request", p.Operation, p.SenderIP, p.SenderHardwareAddr, p.TargetIP)
	}
	if got := f.statsEventually(func(s Stats) uint64 { return s.Ignored }, 3); got != 3 {
		t.Errorf("Ignored = %d, want 3", got)
	}
	if s := f.a.Stats(); s.Defended != 1 {
		t.Errorf("Defended = %d, want 1", s.Defended)
	}
	select {
	case d := <-reports:
		if d.VIP != vip || !bytes.Equal(d.From, rogueMAC) || d.Probe || d.Ignored != 0 {
			t.Errorf("OnDefend told %+v, want the stranger's claim on %s", d, vip)
		}
	default:
		t.Error("OnDefend was not told")
	}
	if len(reports) != 0 {
		t.Errorf("OnDefend told %d more times", len(reports))
	}
}

// TestDefendsAgainstNDClaims: an IPv6 VIP is defended against a
// solicitation from it and an advertisement for it at a stranger's MAC,
// with one unsolicited advertisement to all nodes per DefendInterval.
func TestDefendsAgainstNDClaims(t *testing.T) {
	f := newFixture(t, testOptions())
	f.run()
	if err := f.a.Set(vip6, node1MAC); err != nil {
		t.Fatal(err)
	}
	f.st.drainND()
	g := solicitedNodeMAC(otherIP6)
	f.st.sendND(mustND(t, &ndp.NeighborSolicitation{TargetAddress: otherIP6,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: rogueMAC}}}, rogueMAC, vip6, g[:], solicitedNode(otherIP6)))
	got, dst, ok := f.st.readND(time.Second)
	if !ok {
		t.Fatal("a solicitation from the VIP at a stranger's MAC was not answered")
	}
	if na := advertisement(t, got); na.Solicited || !na.Override || !bytes.Equal(dst, allNodesMAC) || !bytes.Equal(linkLayer(na.Options, ndp.Target), node1MAC) {
		t.Fatalf("defence %+v to %s, want an unsolicited override to all nodes with %s", na, dst, node1MAC)
	}
	f.st.sendND(mustND(t, &ndp.NeighborAdvertisement{Override: true, TargetAddress: vip6,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: rogueMAC}}}, rogueMAC, vip6, allNodesMAC, allNodes))
	if got, _, ok := f.st.readND(200 * time.Millisecond); ok {
		t.Fatalf("a second claim within DefendInterval got %+v", got.msg)
	}
	if s := f.a.Stats(); s.Defended != 1 || s.Ignored != 1 {
		t.Errorf("Stats %+v, want 1 defended, 1 ignored", s)
	}
}

// TestDefendsAgainstForgedClaims: a claim on an owned VIP whose Ethernet
// source is not the MAC it names is defended against all the same:
// stations learn the MAC the packet names (Linux's arp_process takes the
// sender hardware address), so one such frame would take the VIP from
// them as surely as a sincere one.
func TestDefendsAgainstForgedClaims(t *testing.T) {
	f, reports := defending(t)
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	f.settle(vip, node1MAC)
	f.st.sendFrame(arpPacket(arp.OperationRequest, rogueMAC, vip, zeroMAC, vip), clientMAC, ethernet.Broadcast)
	f.st.gratuitous(vip, node1MAC, 2, wait)
	select {
	case d := <-reports:
		if !bytes.Equal(d.From, rogueMAC) {
			t.Errorf("defended against %s, want the MAC the claim names, %s", d.From, rogueMAC)
		}
	case <-time.After(wait):
		t.Error("OnDefend was not told")
	}
	if s := f.a.Stats(); s.Forged != 1 {
		t.Errorf("Forged = %d, want 1", s.Forged)
	}
}
