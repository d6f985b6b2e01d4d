package announce

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

var (
	bridgeMAC = mustMAC("02:00:00:00:00:01")
	node1MAC  = mustMAC("02:00:00:00:01:01")
	node2MAC  = mustMAC("02:00:00:00:01:02")
	clientMAC = mustMAC("02:00:00:00:00:99")
	rogueMAC  = mustMAC("02:00:00:00:00:66")

	clientIP = netip.MustParseAddr("192.0.2.50")
	vip      = netip.MustParseAddr("192.0.2.100")
	otherIP  = netip.MustParseAddr("192.0.2.101")
)

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

// udpSegment carries Ethernet frames between two UDP loopback sockets, standing
// in for a raw socket on a bridge: what one end writes, the other reads.
type udpSegment struct {
	*net.UDPConn
	peer net.Addr
	rx   *rxTime // nil: receive times not kept
}

func (c udpSegment) WriteTo(b []byte, _ net.Addr) (int, error) { return c.UDPConn.WriteTo(b, c.peer) }

// ReadFrom keeps the kernel's receive time of each frame in rx: on loopback
// that is when the frame was written, however late a loaded host runs the
// reader, so tests time the announcer and not the scheduler.
func (c udpSegment) ReadFrom(b []byte) (int, net.Addr, error) {
	if c.rx == nil {
		return c.UDPConn.ReadFrom(b)
	}
	oob := make([]byte, 128)
	n, oobn, _, addr, err := c.UDPConn.ReadMsgUDP(b, oob)
	if err == nil {
		c.rx.set(kernelTime(oob[:oobn]))
	}
	return n, addr, err
}

// rxTime is the receive time of the last frame read.
type rxTime struct {
	mu sync.Mutex
	at time.Time
}

func (r *rxTime) set(t time.Time) {
	r.mu.Lock()
	r.at = t
	r.mu.Unlock()
}

func (r *rxTime) last() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.at
}

// kernelTime reads SO_TIMESTAMPNS from a control message; now if absent.
func kernelTime(oob []byte) time.Time {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return time.Now()
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_TIMESTAMPNS && len(m.Data) >= 16 {
			sec := int64(binary.NativeEndian.Uint64(m.Data[0:8]))
			nsec := int64(binary.NativeEndian.Uint64(m.Data[8:16]))
			return time.Unix(sec, nsec)
		}
	}
	return time.Now()
}

// loopbackInterface is lo with a made-up MAC and name: arp.New needs an
// interface with an IPv4 address, and lo has one.
func loopbackInterface(tb testing.TB, name string, mac net.HardwareAddr) *net.Interface {
	tb.Helper()
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		tb.Fatalf("loopback interface: %v", err)
	}
	ifi := *lo
	ifi.Name = name
	ifi.HardwareAddr = mac
	return &ifi
}

// listenLoopback is one end of a segment.
func listenLoopback(tb testing.TB) *net.UDPConn {
	tb.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		tb.Fatalf("listen UDP: %v", err)
	}
	return c
}

// segmentPair returns two *arp.Client joined by UDP loopback: one for the
// announcer (on "the bridge") and one for a station on the same segment,
// with the station's socket, to write frames no *arp.Client would.
func segmentPair(tb testing.TB) (bridge, station *arp.Client, stationRaw udpSegment, stationRx *rxTime) {
	tb.Helper()
	a, b := listenLoopback(tb), listenLoopback(tb)
	bc, err := arp.New(loopbackInterface(tb, "br-test", bridgeMAC), udpSegment{a, b.LocalAddr(), nil})
	if err != nil {
		tb.Fatalf("arp client: %v", err)
	}
	rc, err := b.SyscallConn()
	if err != nil {
		tb.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1) }); err != nil || serr != nil {
		tb.Fatalf("SO_TIMESTAMPNS: %v %v", err, serr)
	}
	rx := &rxTime{}
	sc, err := arp.New(loopbackInterface(tb, "station", clientMAC), udpSegment{b, a.LocalAddr(), rx})
	if err != nil {
		tb.Fatalf("arp client: %v", err)
	}
	tb.Cleanup(func() { sc.Close() })
	return bc, sc, udpSegment{b, a.LocalAddr(), nil}, rx
}

// ndSegment stands in for the neighbour-discovery packet socket.
type ndSegment struct {
	udpSegment
	promisc atomic.Bool
}

func (c *ndSegment) SetPromiscuous(on bool) error {
	c.promisc.Store(on)
	return nil
}

// ndPair returns the announcer's end and the station's end of a segment
// for neighbour-discovery frames.
func ndPair(tb testing.TB) (bridge *ndSegment, station udpSegment) {
	tb.Helper()
	a, b := listenLoopback(tb), listenLoopback(tb)
	tb.Cleanup(func() { b.Close() })
	return &ndSegment{udpSegment: udpSegment{a, b.LocalAddr(), nil}}, udpSegment{b, a.LocalAddr(), nil}
}

// station is the other end of the segment: it sends frames as any host on the
// bridge might, and reads what the announcer writes.
type station struct {
	tb       testing.TB
	c        *arp.Client
	raw      udpSegment // c's socket: frames written as given
	rx       *rxTime    // when the frame last read was written
	nd       udpSegment // neighbour discovery
	ndBridge *ndSegment // the announcer's end
}

func (s *station) send(p *arp.Packet, dst net.HardwareAddr) {
	s.tb.Helper()
	if err := s.c.WriteTo(p, dst); err != nil {
		s.tb.Fatalf("station write: %v", err)
	}
}

// sendFrame writes a whole ARP frame, its Ethernet source as given: a
// host can write any.
func (s *station) sendFrame(p *arp.Packet, src, dst net.HardwareAddr) {
	s.tb.Helper()
	if _, err := s.raw.WriteTo(frameBytes(s.tb, p, src, dst), nil); err != nil {
		s.tb.Fatalf("station write: %v", err)
	}
}

// request asks who has target, as the client.
func (s *station) request(target netip.Addr) {
	s.tb.Helper()
	s.send(arpPacket(arp.OperationRequest, clientMAC, clientIP, zeroMAC, target), ethernet.Broadcast)
}

// next reads the next frame the announcer wrote, or fails after d.
func (s *station) next(d time.Duration) (*arp.Packet, *ethernet.Frame) {
	s.tb.Helper()
	p, f, err := s.read(d)
	if err != nil {
		s.tb.Fatalf("no frame within %v: %v", d, err)
	}
	return p, f
}

func (s *station) read(d time.Duration) (*arp.Packet, *ethernet.Frame, error) {
	if err := s.c.SetReadDeadline(time.Now().Add(d)); err != nil {
		return nil, nil, err
	}
	return s.c.Read()
}

// drain reads and discards frames until none comes for 50 ms.
func (s *station) drain() {
	for {
		if _, _, err := s.read(50 * time.Millisecond); err != nil {
			return
		}
	}
}

// quiet fails if the announcer writes anything within d.
func (s *station) quiet(d time.Duration) {
	s.tb.Helper()
	p, _, err := s.read(d)
	if err == nil {
		s.tb.Fatalf("unexpected frame: %+v", p)
	}
	if !isTimeout(err) {
		s.tb.Fatalf("station read: %v", err)
	}
}

// fakeNeighbours is an in-memory neighbour table.
type fakeNeighbours struct {
	mu    sync.Mutex
	table map[netip.Addr]netlink.Neigh
	sets  int
	fail  error
}

func newFakeNeighbours() *fakeNeighbours {
	return &fakeNeighbours{table: make(map[netip.Addr]netlink.Neigh)}
}

func (f *fakeNeighbours) NeighSet(n *netlink.Neigh) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sets++
	if f.fail != nil {
		return f.fail
	}
	ip, _ := netip.AddrFromSlice(n.IP)
	f.table[ip.Unmap()] = *n
	return nil
}

func (f *fakeNeighbours) NeighDel(n *netlink.Neigh) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	ip, _ := netip.AddrFromSlice(n.IP)
	if _, ok := f.table[ip.Unmap()]; !ok {
		return syscall.ENOENT
	}
	delete(f.table, ip.Unmap())
	return nil
}

func (f *fakeNeighbours) get(ip netip.Addr) (netlink.Neigh, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.table[ip]
	return n, ok
}

func (f *fakeNeighbours) setFail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

func (f *fakeNeighbours) NeighList(index, _ int) ([]netlink.Neigh, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []netlink.Neigh
	for _, n := range f.table {
		if n.LinkIndex == index {
			out = append(out, n)
		}
	}
	return out, nil
}

// fakeLinks lets a test say "the bridge came back up".
type fakeLinks struct{ up chan struct{} }

func (f *fakeLinks) WatchUp(ctx context.Context, _ string) (<-chan int, error) {
	out := make(chan int)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case <-f.up:
				select {
				case out <- 0:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

// testOptions are fast timers for tests.
func testOptions() Options {
	return Options{Count: 3, Interval: 30 * time.Millisecond, Refresh: -1, ProbeTimeout: 100 * time.Millisecond}
}

type fixture struct {
	a       *Announcer
	st      *station
	neigh   *fakeNeighbours
	run     func() // starts Run; stopped at cleanup
	stopRun func() // stops Run and waits for it
}

// newFixture builds an Announcer over a UDP loopback segment. Run is not
// started until f.run().
func newFixture(tb testing.TB, opts Options) *fixture {
	tb.Helper()
	bc, sc, raw, rx := segmentPair(tb)
	bnd, snd := ndPair(tb)
	neigh := newFakeNeighbours()
	a, err := NewWithConns(loopbackInterface(tb, "br-test", bridgeMAC), Conns{ARP: bc, ND: bnd}, neigh, opts)
	if err != nil {
		tb.Fatalf("NewWithConns: %v", err)
	}
	f := &fixture{a: a, st: &station{tb: tb, c: sc, raw: raw, rx: rx, nd: snd, ndBridge: bnd}, neigh: neigh}
	var once sync.Once
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(testContext(tb))
	f.run = func() {
		go func() { done <- a.Run(ctx) }()
		<-a.started
	}
	f.stopRun = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					tb.Errorf("Run: %v", err)
				}
			case <-time.After(5 * time.Second):
				tb.Errorf("Run did not return within 5s of cancel")
			}
		})
	}
	tb.Cleanup(func() {
		if a.ran.Load() {
			f.stopRun()
		}
		a.Close()
	})
	return f
}

// gratuitous reads n frames and checks each is a gratuitous ARP for vip from
// mac, alternating request and reply forms; it returns when each was written.
func (s *station) gratuitous(vip netip.Addr, mac net.HardwareAddr, n int, d time.Duration) []time.Time {
	s.tb.Helper()
	var at []time.Time
	for i := range n {
		p, f := s.next(d)
		at = append(at, s.rx.last())
		wantOp := arp.OperationRequest
		if i%2 == 1 {
			wantOp = arp.OperationReply
		}
		if p.Operation != wantOp || p.SenderIP != vip || p.TargetIP != vip ||
			!bytes.Equal(p.SenderHardwareAddr, mac) {
			s.tb.Fatalf("frame %d: got %v %s is-at %s (target %s), want gratuitous %v %s is-at %s",
				i, p.Operation, p.SenderIP, p.SenderHardwareAddr, p.TargetIP, wantOp, vip, mac)
		}
		if !bytes.Equal(f.Source, mac) || !bytes.Equal(f.Destination, ethernet.Broadcast) {
			s.tb.Fatalf("frame %d: Ethernet %s -> %s, want %s -> broadcast", i, f.Source, f.Destination, mac)
		}
	}
	return at
}

// statsEventually waits up to a second for a counter to reach want (it is
// bumped just after the frame is written, so the station may see the frame
// first) and returns its value.
func (f *fixture) statsEventually(counter func(Stats) uint64, want uint64) uint64 {
	deadline := time.Now().Add(time.Second)
	for {
		got := counter(f.a.Stats())
		if got == want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(time.Millisecond)
	}
}
