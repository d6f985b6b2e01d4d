package bench

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/labcloud/labcloud/internal/nstest"
	"github.com/labcloud/labcloud/lab/lanprobe"
	"github.com/labcloud/labcloud/lb/announce"
)

// TestWireWatchSeesTheAnnouncer runs the bench's wire measurement against
// the CCM's own announcer on a bridge in a namespace of the test's: a VIP
// announced via one MAC and then moved to another must show up as a
// gratuitous ARP on the bridge and a neighbour entry update naming the new
// MAC, stamped after the move and within the announcer's first round; what
// concerns another VIP, or names the old MAC, must not.
func TestWireWatchSeesTheAnnouncer(t *testing.T) {
	nstest.InNew(t, func(ns netns.NsHandle) { wireWatchSeesTheAnnouncer(t, ns) })
}

// wireWatchSeesTheAnnouncer runs in the namespace ns, entered.
func wireWatchSeesTheAnnouncer(t *testing.T, ns netns.NsHandle) {
	const bridge = "lcbw0"
	mac := func(s string) net.HardwareAddr { m, _ := net.ParseMAC(s); return m }
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridge, HardwareAddr: mac("02:78:00:00:00:01")}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"10.78.0.1/24", "fd78::1/64"} {
		addr, _ := netlink.ParseAddr(a)
		addr.Flags = unix.IFA_F_NODAD
		if err := netlink.AddrAdd(br, addr); err != nil {
			t.Fatal(err)
		}
	}
	// A port that is up gives the bridge its carrier.
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lcbw-port"}, PeerName: "lcbw-peer"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetMaster(veth, br); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"lcbw-peer", "lcbw-port", bridge} {
		l, err := netlink.LinkByName(name)
		if err == nil {
			err = netlink.LinkSetUp(l)
		}
		if err != nil {
			t.Fatalf("%s up: %v", name, err)
		}
	}
	waitOperUp(t, bridge)

	h, err := netlink.NewHandleAt(ns) // Run's goroutines are on other threads
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ifi, err := net.InterfaceByName(bridge)
	if err != nil {
		t.Fatal(err)
	}
	a, err := announce.New(ifi, h, announce.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("announcer: %v", err)
		}
		a.Close()
	}()

	// Not subtests: they would run on threads outside the namespace.
	for _, vips := range [][2]string{{"10.78.0.100", "10.78.0.101"}, {"fd78::100", "fd78::101"}} {
		watchSeesMoves(t, a, bridge, netip.MustParseAddr(vips[0]), netip.MustParseAddr(vips[1]))
	}
	watchSeesOtherHosts(t, bridge)
}

// watchSeesOtherHosts: another host's replica writes the neighbour entries
// of its own nodes' VIPs in that host's namespace, on its bridge of the
// same name; the watch sees them there too.
func watchSeesOtherHosts(t *testing.T, bridge string) {
	other := nstest.Named(t, "lc-bench-host2")
	nstest.IP(t, "-n", other, "link", "add", bridge, "type", "bridge")
	nstest.IP(t, "-n", other, "link", "set", bridge, "up")
	vip := netip.MustParseAddr("10.78.0.102")
	w, err := watchWire(bridge, vip, other)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	since := time.Now()
	nstest.IP(t, "-n", other, "neigh", "replace", vip.String(), "lladdr", "02:78:00:00:02:01", "dev", bridge, "nud", "permanent")
	wctx, done := context.WithTimeout(context.Background(), 2*time.Second)
	defer done()
	s, err := w.wait(wctx, func() (lanprobe.Frame, bool) { return w.firstNeighbour(since, nil) })
	if err != nil || s.MAC.String() != "02:78:00:00:02:01" {
		t.Errorf("the other host's neighbour entry for %s: %v %v, want 02:78:00:00:02:01", vip, s.MAC, err)
	}
}

// watchSeesMoves announces vip via one MAC and moves it to another while
// the wire is watched for it, and another VIP alongside.
func watchSeesMoves(t *testing.T, a *announce.Announcer, bridge string, vip, other netip.Addr) {
	mac := func(s string) net.HardwareAddr { m, _ := net.ParseMAC(s); return m }
	node1, node2, node3 := mac("02:78:00:00:01:01"), mac("02:78:00:00:01:02"), mac("02:78:00:00:01:03")
	w, err := watchWire(bridge, vip)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	check := func(what string, since time.Time, not, want net.HardwareAddr, find func(time.Time, net.HardwareAddr) (lanprobe.Frame, bool)) {
		t.Helper()
		wctx, done := context.WithTimeout(context.Background(), 2*time.Second)
		defer done()
		s, err := w.wait(wctx, func() (lanprobe.Frame, bool) { return find(since, not) })
		if err != nil {
			t.Fatalf("%s: nothing seen naming another MAC than %v within 2 s: %v", what, not, err)
		}
		if s.MAC.String() != want.String() {
			t.Errorf("%s names %s, want %s", what, s.MAC, want)
		}
		// The announcer's first round goes out at once; a second would come
		// 1.1 s later.
		if d := s.At.Sub(since); d < 0 || d > time.Second {
			t.Errorf("%s seen %s after the change, want within the first round", what, d)
		}
		t.Logf("%s: %s %s after the change", what, s.MAC, s.At.Sub(since).Round(time.Microsecond))
	}

	first := time.Now()
	if err := a.Set(vip, node1); err != nil {
		t.Fatal(err)
	}
	check("announcement of the new VIP", first, nil, node1, w.firstGARP)
	check("neighbour entry for the new VIP", first, nil, node1, w.firstNeighbour)
	if err := a.Set(other, node3); err != nil { // another VIP: not this watch's
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if s, ok := w.firstGARP(first, node1); ok {
		t.Fatalf("before the move, an announcement naming %s at %s", s.MAC, s.At)
	}
	if s, ok := w.firstNeighbour(first, node1); ok {
		t.Fatalf("before the move, a neighbour update naming %s at %s", s.MAC, s.At)
	}

	moved := time.Now()
	if err := a.Set(vip, node2); err != nil {
		t.Fatal(err)
	}
	check("announcement after the move", moved, node1, node2, w.firstGARP)
	check("neighbour entry after the move", moved, node1, node2, w.firstNeighbour)
	garps, neighs := w.seen()
	for _, s := range append(garps, neighs...) {
		if s.MAC.String() == node3.String() {
			t.Errorf("the watch for %s recorded %s's %s", vip, other, node3)
		}
	}
}

func waitOperUp(t *testing.T, name string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		l, err := netlink.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if l.Attrs().OperState == netlink.OperUp {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not up: %v", name, l.Attrs().OperState)
		}
	}
}

// seen returns copies of everything recorded so far.
func (w *wireWatch) seen() (garps, neighs []lanprobe.Frame) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.capture.Announced(w.vip, nil, time.Time{}), slices.Clone(w.neighs)
}
