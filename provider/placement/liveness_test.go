package placement

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/labcloud/labcloud/provider/internal/lbtest"
)

// A guest is lost after lostAfterMisses rounds in a row without an answer
// from its own MAC, found again at its first answer; each change, and only
// a change, asks placement for a pass.
func TestLivenessVerdicts(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	macA, macB, other := testMAC("a"), testMAC("b"), testMAC("z")
	var (
		mu     sync.Mutex
		owners = map[netip.Addr]net.HardwareAddr{} // who answers each address now; none: silence
	)
	probe := func(_ context.Context, ip netip.Addr, mac net.HardwareAddr) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return bytes.Equal(owners[ip], mac), nil
	}
	answer := func(ip netip.Addr, mac net.HardwareAddr) {
		mu.Lock()
		defer mu.Unlock()
		if mac == nil {
			delete(owners, ip)
		} else {
			owners[ip] = mac
		}
	}
	passes := 0
	l := newLiveness(probe, func() { passes++ })
	// Each round after the longest wait: every guest is due in each.
	at := time.Now()
	nextRound := func(ctx context.Context) {
		at = at.Add(livenessMaxWait)
		l.round(ctx, at)
	}
	l.watch(map[netip.Addr]net.HardwareAddr{a: macA, b: macB})
	answer(a, macA)
	answer(b, other) // another host answers for b's address: not b
	ctx := context.Background()

	for round, want := range []struct {
		lostA, lostB bool
		passes       int
	}{{false, false, 0}, {false, true, 1}, {false, true, 1}} {
		nextRound(ctx)
		if l.lost(a) != want.lostA || l.lost(b) != want.lostB || passes != want.passes {
			t.Fatalf("round %d: lost a=%v b=%v, %d passes; want %v %v %d", round+1, l.lost(a), l.lost(b), passes, want.lostA, want.lostB, want.passes)
		}
	}
	answer(b, macB)
	nextRound(ctx)
	if l.lost(b) || passes != 2 {
		t.Fatalf("b answered: lost %v, %d passes; want found, a second pass", l.lost(b), passes)
	}
	answer(a, nil)
	nextRound(ctx)
	if l.lost(a) {
		t.Fatalf("a lost after one silent round; want %d", lostAfterMisses)
	}
	// A new MAC for a starts its count again; an address no longer
	// watched has no verdict.
	l.watch(map[netip.Addr]net.HardwareAddr{a: macB})
	nextRound(ctx)
	if l.lost(a) {
		t.Fatalf("a's count survived a new MAC")
	}
	nextRound(ctx)
	if !l.lost(a) || l.lost(b) {
		t.Fatalf("after two silent rounds with its new MAC: a lost %v; b (unwatched) lost %v", l.lost(a), l.lost(b))
	}
	l.watch(nil)
	if l.lost(a) {
		t.Fatalf("an unwatched address is lost")
	}
}

// A failed probe is no verdict: it neither loses nor finds a guest.
func TestLivenessProbeErrors(t *testing.T) {
	a := netip.MustParseAddr("10.0.0.1")
	l := newLiveness(func(context.Context, netip.Addr, net.HardwareAddr) (bool, error) {
		return false, net.ErrClosed
	}, func() { t.Errorf("a pass asked for without a verdict") })
	l.watch(map[netip.Addr]net.HardwareAddr{a: testMAC("a")})
	for range 2 * lostAfterMisses {
		l.round(context.Background(), time.Now())
	}
	if l.lost(a) {
		t.Errorf("lost on probe errors alone")
	}
}

// Placement's liveness asks the announcer for the guest's own MAC, so that
// another host answering for the guest's address is no answer.
func TestPlacementProbesForTheGuestsMAC(t *testing.T) {
	ann := lbtest.NewAnnouncer()
	p := New(Config{Announcer: ann})
	ip, guest := netip.MustParseAddr("10.0.0.1"), testMAC("a")
	ann.SetForeign(ip, testMAC("z"))
	p.live.watch(map[netip.Addr]net.HardwareAddr{ip: guest})
	ctx, at := context.Background(), time.Now()
	for range lostAfterMisses {
		at = at.Add(livenessMaxWait)
		p.live.round(ctx, at)
	}
	if !p.live.lost(ip) {
		t.Fatalf("not lost after %d rounds answered by another MAC only", lostAfterMisses)
	}
	ann.SetForeign(ip, guest)
	p.live.round(ctx, at.Add(livenessMaxWait))
	if p.live.lost(ip) {
		t.Errorf("still lost after the guest's MAC answered")
	}
}

func TestProbeAddress(t *testing.T) {
	node := func(addrs ...v1.NodeAddress) *v1.Node {
		return &v1.Node{Status: v1.NodeStatus{Addresses: addrs}}
	}
	for _, tc := range []struct {
		node *v1.Node
		want string
	}{
		{node(v1.NodeAddress{Type: v1.NodeHostName, Address: "n"}, v1.NodeAddress{Type: v1.NodeInternalIP, Address: "fd00::5"},
			v1.NodeAddress{Type: v1.NodeInternalIP, Address: "10.0.0.5"}), "10.0.0.5"},
		{node(v1.NodeAddress{Type: v1.NodeInternalIP, Address: "fd00::5"}, v1.NodeAddress{Type: v1.NodeInternalIP, Address: "fd00::6"}), "fd00::5"},
		{node(v1.NodeAddress{Type: v1.NodeExternalIP, Address: "10.0.0.5"}, v1.NodeAddress{Type: v1.NodeInternalIP, Address: "bad"}), ""},
	} {
		got, ok := probeAddress(tc.node)
		if (tc.want == "") == ok || ok && got.String() != tc.want {
			t.Errorf("probeAddress(%v) = %v %v, want %q", tc.node.Status.Addresses, got, ok, tc.want)
		}
	}
}

// The probe loop probes while a guest is watched, from the moment
// placement watches one (it sleeps before), and stops when none is.
func TestLivenessProbesWhileWatched(t *testing.T) {
	var (
		mu     sync.Mutex
		probes int
	)
	probed := func() int {
		mu.Lock()
		defer mu.Unlock()
		return probes
	}
	l := newLiveness(func(context.Context, netip.Addr, net.HardwareAddr) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		probes++
		return false, nil
	}, func() {})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.run(ctx) }()
	defer func() { cancel(); <-done }()

	time.Sleep(5 * livenessRound)
	if n := probed(); n != 0 {
		t.Fatalf("%d probes with no guest watched", n)
	}
	l.watch(map[netip.Addr]net.HardwareAddr{netip.MustParseAddr("10.0.0.1"): testMAC("a")})
	deadline := time.Now().Add(10 * time.Second)
	for probed() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d probes 10 s after a guest was watched, want rounds every %s", probed(), livenessRound)
		}
		time.Sleep(livenessRound / 2)
	}
	l.watch(nil)
	time.Sleep(2 * livenessRound) // a round in flight ends
	before := probed()
	time.Sleep(5 * livenessRound)
	if n := probed(); n != before {
		t.Errorf("%d probes after the last guest was unwatched, want none", n-before)
	}
}

// TestLivenessBacksOffSilentGuests: a guest lost as fast as ever
// (lostAfterMisses rounds) and silent since is probed ever less often, up
// to livenessMaxWait apart, so that a host that is gone costs its LAN a
// few probes a minute per guest, not ten a second; a guest that answers
// is probed every round; an answer, or watching the guest anew, brings
// back probing every round.
func TestLivenessBacksOffSilentGuests(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	macA, macB := testMAC("a"), testMAC("b")
	var (
		mu     sync.Mutex
		probes = map[netip.Addr]int{}
		silent = map[netip.Addr]bool{b: true}
	)
	probed := func(ip netip.Addr) int {
		mu.Lock()
		defer mu.Unlock()
		return probes[ip]
	}
	setSilent := func(ip netip.Addr, s bool) {
		mu.Lock()
		defer mu.Unlock()
		silent[ip] = s
	}
	mac := map[netip.Addr]net.HardwareAddr{a: macA, b: macB}
	l := newLiveness(func(_ context.Context, ip netip.Addr, m net.HardwareAddr) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		probes[ip]++
		return !silent[ip] && bytes.Equal(m, mac[ip]), nil
	}, func() {})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.run(ctx) }()
	defer func() { cancel(); <-done }()
	waitLost := func(what string, want bool, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for l.lost(b) != want {
			if time.Since(start) > within {
				t.Fatalf("%s: b lost %v after %s, want %v within %s", what, l.lost(b), time.Since(start), want, within)
			}
			time.Sleep(livenessRound / 10)
		}
		return time.Since(start)
	}

	l.watch(mac)
	// Rounds of a loaded host run late: a round and a half of slack each.
	firstDetection := (lostAfterMisses + 2) * livenessRound * 3 / 2
	waitLost("first detection", true, firstDetection)
	const window = 3 * time.Second
	a0, b0 := probed(a), probed(b)
	time.Sleep(window)
	if n := probed(a) - a0; n < int(window/livenessRound)/2 {
		t.Errorf("an answering guest was probed %d times in %s, want one probe a round (%s)", n, window, livenessRound)
	}
	// Waits of 2, 4, 8, 16 rounds fit in 3 s: 4 probes, 5 at a boundary.
	if n := probed(b) - b0; n > 5 {
		t.Errorf("a lost, silent guest was probed %d times in %s, want at most 5 (waits doubling from %s)", n, window, 2*livenessRound)
	}

	// It answers again: found at its next probe, then probed every round,
	// so that its next death is found as fast as its first.
	setSilent(b, false)
	waitLost("answering again", false, livenessMaxWait+time.Second)
	setSilent(b, true)
	waitLost("silent again", true, firstDetection)

	// Watched anew (its hypervisor answered, then not again): every round.
	time.Sleep(window)
	l.watch(map[netip.Addr]net.HardwareAddr{a: macA})
	l.watch(mac)
	b0 = probed(b)
	waitLost("watched anew", true, firstDetection)
	if n := probed(b) - b0; n < lostAfterMisses {
		t.Errorf("watched anew: lost after %d probes, want %d", n, lostAfterMisses)
	}
}
