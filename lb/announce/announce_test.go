package announce

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/vishvananda/netlink"
)

const wait = 2 * time.Second

// settle lets the initial gratuitous burst for vip pass, so that later reads
// see only what the test provokes.
func (f *fixture) settle(vip netip.Addr, mac net.HardwareAddr) {
	f.st.tb.Helper()
	f.st.gratuitous(vip, mac, 2*f.a.opts.Count, wait)
}

func TestAnswersOwnedVIPWithChosenMAC(t *testing.T) {
	f := newFixture(t, testOptions())
	f.run()
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	f.settle(vip, node1MAC)

	f.st.request(vip)
	p, eth := f.st.next(wait)
	if p.Operation != arp.OperationReply || p.SenderIP != vip || !bytes.Equal(p.SenderHardwareAddr, node1MAC) ||
		p.TargetIP != clientIP || !bytes.Equal(p.TargetHardwareAddr, clientMAC) {
		t.Fatalf("reply = %v %s is-at %s to %s/%s; want reply %s is-at %s to %s/%s",
			p.Operation, p.SenderIP, p.SenderHardwareAddr, p.TargetIP, p.TargetHardwareAddr,
			vip, node1MAC, clientIP, clientMAC)
	}
	if !bytes.Equal(eth.Source, node1MAC) || !bytes.Equal(eth.Destination, clientMAC) {
		t.Fatalf("Ethernet %s -> %s, want %s -> %s", eth.Source, eth.Destination, node1MAC, clientMAC)
	}
	if got := f.statsEventually(func(s Stats) uint64 { return s.Replies }, 1); got != 1 {
		t.Errorf("Stats().Replies = %d, want 1", got)
	}
}

// TestAnswersProbeForOwnedVIP: another host probing an owned VIP (sender IP
// 0.0.0.0) is told it is taken, as RFC 5227 expects.
func TestAnswersProbeForOwnedVIP(t *testing.T) {
	f := newFixture(t, testOptions())
	f.run()
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	f.settle(vip, node1MAC)
	f.st.send(arpPacket(arp.OperationRequest, rogueMAC, netip.IPv4Unspecified(), zeroMAC, vip), ethernet.Broadcast)
	p, eth := f.st.next(wait)
	if p.Operation != arp.OperationReply || p.SenderIP != vip || !bytes.Equal(p.SenderHardwareAddr, node1MAC) ||
		!p.TargetIP.IsUnspecified() || !bytes.Equal(eth.Destination, rogueMAC) {
		t.Fatalf("got %v %s is-at %s to %s via %s", p.Operation, p.SenderIP, p.SenderHardwareAddr, p.TargetIP, eth.Destination)
	}
}

// TestIgnoresEverythingElse sends frames that must not be answered, then a
// request that must be: the first frame back has to be the answer to the last
// request (the segment keeps order), so nothing was sent for the others.
func TestIgnoresEverythingElse(t *testing.T) {
	f := newFixture(t, testOptions())
	f.run()
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	f.settle(vip, node1MAC)

	notIPv4 := arpPacket(arp.OperationRequest, clientMAC, clientIP, zeroMAC, vip)
	notIPv4.ProtocolType = 0x86dd
	ignored := map[string]*arp.Packet{
		"request for an unowned address":  arpPacket(arp.OperationRequest, clientMAC, clientIP, zeroMAC, otherIP),
		"request for the bridge's subnet": arpPacket(arp.OperationRequest, clientMAC, clientIP, zeroMAC, netip.MustParseAddr("192.0.2.1")),
		"gratuitous request from the VIP": arpPacket(arp.OperationRequest, node1MAC, vip, zeroMAC, vip),
		"gratuitous reply from the VIP":   arpPacket(arp.OperationReply, node1MAC, vip, ethernet.Broadcast, vip),
		"our own probe":                   arpPacket(arp.OperationRequest, bridgeMAC, netip.IPv4Unspecified(), zeroMAC, vip),
		"request from the chosen node":    arpPacket(arp.OperationRequest, node1MAC, netip.MustParseAddr("192.0.2.11"), zeroMAC, vip),
		"multicast sender":                arpPacket(arp.OperationRequest, mustMAC("01:00:5e:00:00:01"), clientIP, zeroMAC, vip),
		"not IPv4":                        notIPv4,
	}
	for name, p := range ignored {
		t.Log("sending:", name)
		f.st.send(p, ethernet.Broadcast)
	}
	f.st.request(vip)
	p, _ := f.st.next(wait)
	if p.Operation != arp.OperationReply || p.TargetIP != clientIP || p.SenderIP != vip {
		t.Fatalf("first frame back is %v %s is-at %s to %s, not the answer to the last request",
			p.Operation, p.SenderIP, p.SenderHardwareAddr, p.TargetIP)
	}
	f.st.quiet(100 * time.Millisecond)
	if got := f.statsEventually(func(s Stats) uint64 { return s.Replies }, 1); got != 1 {
		t.Errorf("Stats().Replies = %d, want 1", got)
	}
}

func TestNothingOwnedNothingAnswered(t *testing.T) {
	f := newFixture(t, testOptions())
	f.run()
	for _, ip := range []netip.Addr{vip, otherIP, clientIP} {
		f.st.request(ip)
	}
	f.st.quiet(200 * time.Millisecond)
}

func TestRemoveStopsAnswering(t *testing.T) {
	f := newFixture(t, testOptions())
	f.run()
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.neigh.get(vip); !ok {
		t.Fatal("no neighbour entry after Set")
	}
	if err := f.a.Remove(vip); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.neigh.get(vip); ok {
		t.Fatal("neighbour entry still there after Remove")
	}
	if _, ok := f.a.Owned(vip); ok {
		t.Fatal("Owned after Remove")
	}
	f.st.drain()
	f.st.request(vip)
	f.st.quiet(200 * time.Millisecond)
	// Removing again, or something never set, is fine.
	if err := f.a.Remove(vip); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	if err := f.a.Remove(otherIP); err != nil {
		t.Fatalf("Remove of unknown VIP: %v", err)
	}
}

func TestGratuitousOnSetAndOnMove(t *testing.T) {
	opts := testOptions()
	f := newFixture(t, opts)
	f.run()
	start := time.Now()
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("Set took %v; it must not wait for the announcement", d)
	}
	at := f.st.gratuitous(vip, node1MAC, 2*opts.Count, wait)
	if first := at[0].Sub(start); first > 200*time.Millisecond {
		t.Errorf("first gratuitous frame %v after Set; want it at once", first)
	}
	if span := at[len(at)-1].Sub(at[0]); span < time.Duration(opts.Count-1)*opts.Interval*8/10 {
		t.Errorf("%d rounds spanned %v; want them %v apart", opts.Count, span, opts.Interval)
	}
	f.st.quiet(3 * opts.Interval)
	if got := f.statsEventually(func(s Stats) uint64 { return s.Gratuitous }, uint64(2*opts.Count)); got != uint64(2*opts.Count) {
		t.Errorf("Stats().Gratuitous = %d, want %d", got, 2*opts.Count)
	}

	// Move to node 2: a new burst with the new MAC, and answers with it.
	if err := f.a.Set(vip, node2MAC); err != nil {
		t.Fatal(err)
	}
	f.st.gratuitous(vip, node2MAC, 2*opts.Count, wait)
	f.st.request(vip)
	p, _ := f.st.next(wait)
	if !bytes.Equal(p.SenderHardwareAddr, node2MAC) {
		t.Fatalf("after the move, answered with %s, want %s", p.SenderHardwareAddr, node2MAC)
	}
	if got := f.statsEventually(func(s Stats) uint64 { return s.Gratuitous }, uint64(4*opts.Count)); got != uint64(4*opts.Count) {
		t.Errorf("Stats().Gratuitous = %d, want %d", got, 4*opts.Count)
	}
}

func TestSameSetSendsNothing(t *testing.T) {
	opts := testOptions()
	opts.Interval = 100 * time.Millisecond
	f := newFixture(t, opts)
	f.run()
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	f.st.gratuitous(vip, node1MAC, 2, wait)
	// Repeating it mid-burst neither restarts nor extends the burst ...
	for range 5 {
		if err := f.a.Set(vip, node1MAC); err != nil {
			t.Fatal(err)
		}
	}
	f.st.gratuitous(vip, node1MAC, 2*(opts.Count-1), wait)
	f.st.quiet(3 * opts.Interval)
	// ... and after it, sends nothing at all.
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	f.st.quiet(3 * opts.Interval)
	if got := f.statsEventually(func(s Stats) uint64 { return s.Gratuitous }, uint64(2*opts.Count)); got != uint64(2*opts.Count) {
		t.Errorf("Stats().Gratuitous = %d, want %d", got, 2*opts.Count)
	}
	if f.neigh.sets != 1 {
		t.Errorf("neighbour set %d times, want 1", f.neigh.sets)
	}
}

func TestSetBeforeRunAnnouncesAtStart(t *testing.T) {
	opts := testOptions()
	f := newFixture(t, opts)
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	if err := f.a.Set(otherIP, node2MAC); err != nil {
		t.Fatal(err)
	}
	f.st.quiet(100 * time.Millisecond)
	f.run()
	seen := map[netip.Addr]int{}
	for range 4 * opts.Count {
		p, _ := f.st.next(wait)
		seen[p.SenderIP]++
	}
	if seen[vip] != 2*opts.Count || seen[otherIP] != 2*opts.Count {
		t.Fatalf("gratuitous frames per VIP = %v, want %d each", seen, 2*opts.Count)
	}
}

func TestNeighbourEntries(t *testing.T) {
	f := newFixture(t, testOptions())
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	n, ok := f.neigh.get(vip)
	if !ok {
		t.Fatal("no neighbour entry")
	}
	want := netlink.Neigh{LinkIndex: f.a.bridge.Load().index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT}
	if n.LinkIndex != want.LinkIndex || n.Family != want.Family || n.State != want.State ||
		!bytes.Equal(n.HardwareAddr, node1MAC) || !n.IP.Equal(net.IP(vip.AsSlice())) {
		t.Fatalf("neighbour = %+v; want %s lladdr %s dev #%d nud permanent", n, vip, node1MAC, want.LinkIndex)
	}
	if err := f.a.Set(vip, node2MAC); err != nil {
		t.Fatal(err)
	}
	if n, _ := f.neigh.get(vip); !bytes.Equal(n.HardwareAddr, node2MAC) {
		t.Fatalf("after the move the neighbour entry has %s, want %s", n.HardwareAddr, node2MAC)
	}

	// A failure is reported, the VIP is still owned, and the same Set retries.
	boom := errors.New("netlink is down")
	f.neigh.setFail(boom)
	if err := f.a.Set(otherIP, node1MAC); !errors.Is(err, boom) {
		t.Fatalf("Set with failing neighbours = %v, want %v", err, boom)
	}
	if _, ok := f.a.Owned(otherIP); !ok {
		t.Fatal("VIP not owned after a neighbour failure")
	}
	f.neigh.setFail(nil)
	if err := f.a.Set(otherIP, node1MAC); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.neigh.get(otherIP); !ok {
		t.Fatal("the repeated Set did not retry the neighbour entry")
	}
	f.neigh.setFail(boom)
	if err := f.a.Remove(otherIP); !errors.Is(err, boom) {
		t.Fatalf("Remove with failing neighbours = %v, want %v", err, boom)
	}
}

func TestSetRejects(t *testing.T) {
	f := newFixture(t, testOptions())
	for _, tc := range []struct {
		name string
		vip  netip.Addr
		mac  net.HardwareAddr
	}{
		{"IPv6 link-local VIP", netip.MustParseAddr("fe80::1"), node1MAC},
		{"IPv6 multicast VIP", netip.MustParseAddr("ff02::1"), node1MAC},
		{"IPv6 unspecified VIP", netip.IPv6Unspecified(), node1MAC},
		{"IPv6 VIP with a zone", netip.MustParseAddr("fd00::1%br0"), node1MAC},
		{"invalid VIP", netip.Addr{}, node1MAC},
		{"unspecified VIP", netip.IPv4Unspecified(), node1MAC},
		{"broadcast VIP", netip.MustParseAddr("255.255.255.255"), node1MAC},
		{"multicast VIP", netip.MustParseAddr("224.0.0.1"), node1MAC},
		{"short MAC", vip, net.HardwareAddr{1, 2, 3}},
		{"broadcast MAC", vip, ethernet.Broadcast},
		{"multicast MAC", vip, mustMAC("01:00:5e:00:00:01")},
		{"zero MAC", vip, zeroMAC},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := f.a.Set(tc.vip, tc.mac); err == nil {
				t.Fatalf("Set(%s, %s) succeeded", tc.vip, tc.mac)
			}
		})
	}
	if _, ok := f.a.Owned(vip); ok {
		t.Fatal("a rejected Set took effect")
	}
	// An IPv4-mapped IPv6 VIP is the IPv4 one.
	if err := f.a.Set(netip.MustParseAddr("::ffff:192.0.2.100"), node1MAC); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.a.Owned(vip); !ok {
		t.Fatal("mapped VIP not owned as IPv4")
	}
}

func TestLinkUpReannounces(t *testing.T) {
	opts := testOptions()
	links := &fakeLinks{up: make(chan struct{})}
	opts.Links = links
	f := newFixture(t, opts)
	f.run()
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	f.settle(vip, node1MAC)
	f.st.quiet(3 * opts.Interval)
	// The kernel flushes neighbour entries, permanent ones too, when the
	// bridge goes down.
	f.neigh.mu.Lock()
	clear(f.neigh.table)
	f.neigh.mu.Unlock()

	links.up <- struct{}{}
	f.st.gratuitous(vip, node1MAC, 2*opts.Count, wait)
	if _, ok := f.neigh.get(vip); !ok {
		t.Fatal("neighbour entry not re-installed when the link came back")
	}
}

func TestRefresh(t *testing.T) {
	opts := testOptions()
	opts.Refresh = 150 * time.Millisecond
	f := newFixture(t, opts)
	f.run()
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	f.settle(vip, node1MAC)
	// Each refresh is one round: a request and a reply.
	for range 2 {
		start := time.Now()
		f.st.gratuitous(vip, node1MAC, 2, wait)
		if d := time.Since(start); d > opts.Refresh+100*time.Millisecond {
			t.Errorf("refresh round after %v; want every %v", d, opts.Refresh)
		}
		f.st.quiet(opts.Refresh / 2)
	}
}

func TestProbe(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, testOptions())
	f.run()

	// Nobody answers: free, after about the probe timeout, with two probes sent.
	start := time.Now()
	owner, taken, err := f.a.Probe(ctx, otherIP)
	if err != nil || taken {
		t.Fatalf("Probe of a free address = %s, %v, %v", owner, taken, err)
	}
	if d := time.Since(start); d < f.a.opts.ProbeTimeout || d > 3*f.a.opts.ProbeTimeout {
		t.Errorf("free Probe took %v; want about %v", d, f.a.opts.ProbeTimeout)
	}
	for i := range 2 {
		p, eth := f.st.next(wait)
		if p.Operation != arp.OperationRequest || !p.SenderIP.IsUnspecified() || p.TargetIP != otherIP ||
			!bytes.Equal(p.SenderHardwareAddr, bridgeMAC) || !bytes.Equal(eth.Destination, ethernet.Broadcast) {
			t.Fatalf("probe %d = %v %s/%s -> %s", i, p.Operation, p.SenderIP, p.SenderHardwareAddr, p.TargetIP)
		}
	}

	// Someone answers the probe: taken, by them.
	answer := func(sender net.HardwareAddr, ip netip.Addr) {
		p, _, err := f.st.read(wait)
		if err != nil || p.TargetIP != ip {
			t.Errorf("waiting for a probe for %s: %v %+v", ip, err, p)
			return
		}
		if err := f.st.c.WriteTo(arpPacket(arp.OperationReply, sender, ip, bridgeMAC, netip.IPv4Unspecified()), bridgeMAC); err != nil {
			t.Error(err)
		}
	}
	go answer(rogueMAC, otherIP)
	owner, taken, err = f.a.Probe(ctx, otherIP)
	if err != nil || !taken || !bytes.Equal(owner, rogueMAC) {
		t.Fatalf("Probe of a taken address = %s, %v, %v; want %s, true", owner, taken, err, rogueMAC)
	}
	f.st.drain() // the second probe, if it got out

	// Another host probing the same address at the same time is a conflict too.
	go func() {
		if _, _, err := f.st.read(wait); err != nil {
			t.Error(err)
			return
		}
		if err := f.st.c.WriteTo(arpPacket(arp.OperationRequest, rogueMAC, netip.IPv4Unspecified(), zeroMAC, otherIP), ethernet.Broadcast); err != nil {
			t.Error(err)
		}
	}()
	if _, taken, err := f.a.Probe(ctx, otherIP); err != nil || !taken {
		t.Fatalf("Probe during another host's probe = %v, %v; want taken", taken, err)
	}
	f.st.drain()

	// Our own choice answering for an owned VIP is not a conflict.
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	f.settle(vip, node1MAC)
	go answer(node1MAC, vip)
	if owner, taken, err := f.a.Probe(ctx, vip); err != nil || taken {
		t.Fatalf("Probe answered by our own choice = %s, %v, %v; want free", owner, taken, err)
	}

	// A cancelled context ends the wait.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := f.a.Probe(cctx, otherIP); !errors.Is(err, context.Canceled) {
		t.Fatalf("Probe with a cancelled context = %v", err)
	}
}

// TestProbesRunConcurrently: many probes together take about one timeout,
// not one each.
func TestProbesRunConcurrently(t *testing.T) {
	f := newFixture(t, testOptions())
	f.run()
	const n = 32
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			ip := netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)})
			if _, taken, err := f.a.Probe(context.Background(), ip); err != nil || taken {
				errs <- errors.Join(err, errors.New("unexpectedly taken"))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if d := time.Since(start); d > 4*f.a.opts.ProbeTimeout {
		t.Errorf("%d concurrent probes took %v; want about %v", n, d, f.a.opts.ProbeTimeout)
	}
}

func TestProbeNeedsRun(t *testing.T) {
	f := newFixture(t, testOptions())
	if _, _, err := f.a.Probe(context.Background(), vip); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Probe before Run = %v, want ErrNotRunning", err)
	}
	f.run()
	f.stopRun()
	if _, _, err := f.a.Probe(context.Background(), vip); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Probe after Run = %v, want ErrNotRunning", err)
	}
}

func TestRunStopsWithContext(t *testing.T) {
	opts := testOptions()
	opts.Refresh = time.Hour
	opts.Links = &fakeLinks{up: make(chan struct{})}
	f := newFixture(t, opts)
	f.run()
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	f.stopRun() // fails the test if Run does not return
	if d := time.Since(start); d > time.Second {
		t.Errorf("Run took %v to stop", d)
	}
	if err := f.a.Run(context.Background()); err == nil {
		t.Error("second Run succeeded")
	}
}

// TestNoFramesAfterRemove: a VIP removed in the middle of its burst gets no
// more frames once Remove has returned.
func TestNoFramesAfterRemove(t *testing.T) {
	opts := testOptions()
	opts.Interval = 50 * time.Millisecond
	f := newFixture(t, opts)
	f.run()
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	f.st.gratuitous(vip, node1MAC, 2, wait)
	if err := f.a.Remove(vip); err != nil {
		t.Fatal(err)
	}
	sent := f.a.Stats().Gratuitous
	f.st.drain() // what was written before Remove returned
	f.st.quiet(3 * opts.Interval)
	if got := f.statsEventually(func(s Stats) uint64 { return s.Gratuitous }, sent); got != sent {
		t.Fatalf("%d gratuitous frames after Remove", got-sent)
	}
}

// goroutinesBackTo waits for the goroutine count to fall back to n.
func goroutinesBackTo(t *testing.T, n int) {
	t.Helper()
	if _, ok := waitFor(2*time.Second, func() bool { return runtime.NumGoroutine() <= n }); !ok {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines left running, want %d:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
	}
}

func TestRunLeavesNoGoroutines(t *testing.T) {
	opts := testOptions()
	opts.Refresh = 50 * time.Millisecond
	opts.Links = &fakeLinks{up: make(chan struct{})}
	f := newFixture(t, opts)
	base := runtime.NumGoroutine()
	f.run()
	if err := f.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	go f.a.Probe(context.Background(), otherIP)
	f.st.request(vip)
	time.Sleep(100 * time.Millisecond)
	f.stopRun()
	goroutinesBackTo(t, base)
}
