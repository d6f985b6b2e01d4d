package bgp

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/labcloud/labcloud/internal/frr"
	"github.com/labcloud/labcloud/internal/nstest"
	"github.com/labcloud/labcloud/metrics"
)

// The speaker under test runs in a process of its own inside a namespace
// of its own (GoBGP's goroutines cannot be kept in one namespace inside
// this process), driven over stdin by TestSpeakerProcess; FRR is the peer,
// in another namespace, joined to the speaker's by a veth pair.

const (
	routerASN  = 64512
	speakerASN = 64513
)

var (
	routerAddr  = netip.MustParseAddr("192.0.2.1")
	speakerAddr = netip.MustParseAddr("192.0.2.2")
	// Node addresses on the router's connected network, so that zebra
	// selects the routes through them.
	node1, node2 = netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("192.0.2.12")
	node1v6      = netip.MustParseAddr("2001:db8::11")
)

type lab struct {
	t        *testing.T
	router   *frr.Router
	routerNS string
	speaker  string // its namespace
	opts     Options
}

func newLab(t *testing.T, bfd bool) *lab {
	t.Helper()
	if err := frr.Available(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skipf("needs FRR: %v", err)
	}
	rns, sns := nstest.Named(t, "lc-bgp-router"), nstest.Named(t, "lc-bgp-speaker")
	nstest.Link(t, rns, "r0", []string{"192.0.2.1/24", "2001:db8::1/64"}, sns, "s0", []string{"192.0.2.2/24", "2001:db8::2/64"})
	// Not t.TempDir(): the frr user must reach its directory.
	dir, err := os.MkdirTemp("", "lc-frr-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	r, err := frr.Start(context.Background(), rns, dir, frr.Config{
		ASN: routerASN, RouterID: routerAddr,
		Neighbors: []frr.Neighbor{{Address: speakerAddr, ASN: speakerASN, BFD: bfd}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(r.LogTail(15))
		}
		r.Stop()
	})
	return &lab{t: t, router: r, routerNS: rns, speaker: sns, opts: Options{
		ASN: speakerASN, RouterID: speakerAddr,
		Peers:       []Peer{{Address: routerAddr, ASN: routerASN, BFD: bfd}},
		Communities: []uint32{routerASN<<16 | 76},
		RestartTime: 30 * time.Second,
	}}
}

// speakerProc is one run of the speaker in its namespace.
type speakerProc struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	ended chan struct{}
}

func (l *lab) startSpeaker() *speakerProc {
	l.t.Helper()
	opts, err := json.Marshal(l.opts)
	if err != nil {
		l.t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", l.speaker, os.Args[0], "-test.run=^TestSpeakerProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "LABCLOUD_BGP_SPEAKER="+string(opts))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		l.t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		l.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	p := &speakerProc{t: l.t, cmd: cmd, in: in, out: bufio.NewScanner(out), ended: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.ended) }()
	l.t.Cleanup(func() { _ = cmd.Process.Kill(); <-p.ended })
	return p
}

// do sends one command and returns the speaker's answer line.
func (p *speakerProc) do(command string) string {
	p.t.Helper()
	if _, err := fmt.Fprintln(p.in, command); err != nil {
		p.t.Fatalf("speaker: %v", err)
	}
	for p.out.Scan() {
		if line, ok := strings.CutPrefix(p.out.Text(), "speaker: "); ok {
			if strings.HasPrefix(line, "error: ") {
				p.t.Fatalf("speaker %s: %s", command, line)
			}
			return line
		}
	}
	p.t.Fatalf("speaker ended during %q", command)
	return ""
}

func (p *speakerProc) announce(routes ...Route) {
	p.t.Helper()
	b, _ := json.Marshal(routes)
	p.do("announce " + string(b))
}

// waitRIB polls the router's BGP routes of one family until ok holds.
func (l *lab) waitRIB(family string, within time.Duration, ok func(map[netip.Prefix]frr.Route) bool) map[netip.Prefix]frr.Route {
	l.t.Helper()
	rib, err := l.router.WaitBGPRoutes(context.Background(), family, within, ok)
	if err != nil {
		l.t.Fatalf("router's %s BGP routes after %s (%v): %v", family, within, err, rib)
	}
	return rib
}

func via(rib map[netip.Prefix]frr.Route, prefix string, hop netip.Addr) bool {
	r, ok := rib[netip.MustParsePrefix(prefix)]
	return ok && r.Selected && slices.Contains(r.NextHops, hop)
}

func TestRouterLearnsPodCIDRs(t *testing.T) {
	l := newLab(t, false)
	sp := l.startSpeaker()
	sp.announce(
		Route{netip.MustParsePrefix("10.244.1.0/24"), node1},
		Route{netip.MustParsePrefix("10.244.2.0/24"), node2},
		Route{netip.MustParsePrefix("fd00:244:1::/64"), node1v6},
	)
	l.waitRIB("ip", 20*time.Second, func(rib map[netip.Prefix]frr.Route) bool {
		return via(rib, "10.244.1.0/24", node1) && via(rib, "10.244.2.0/24", node2)
	})
	l.waitRIB("ipv6", 5*time.Second, func(rib map[netip.Prefix]frr.Route) bool {
		return via(rib, "fd00:244:1::/64", node1v6)
	})
	out, err := l.router.Vtysh(context.Background(), "show bgp ipv4 unicast 10.244.1.0/24 json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, fmt.Sprintf("%d:76", routerASN)) {
		t.Errorf("route carries no community %d:76: %s", routerASN, out)
	}

	// A prefix given two next hops costs only that prefix: it keeps its
	// next hop, and a new one is announced beside it.
	b, _ := json.Marshal([]Route{
		{netip.MustParsePrefix("10.244.1.0/24"), node2}, {netip.MustParsePrefix("10.244.1.0/24"), node1},
		{netip.MustParsePrefix("10.244.2.0/24"), node2}, {netip.MustParsePrefix("10.244.3.0/24"), node1},
	})
	if got := sp.do("announce " + string(b)); !strings.Contains(got, "prefix 10.244.1.0/24 given next hops") {
		t.Errorf("announcing a prefix with two next hops: %q, want it named", got)
	}
	l.waitRIB("ip", 5*time.Second, func(rib map[netip.Prefix]frr.Route) bool {
		return via(rib, "10.244.1.0/24", node1) && via(rib, "10.244.2.0/24", node2) && via(rib, "10.244.3.0/24", node1)
	})

	// A moved pod CIDR (a Node re-created elsewhere) and a deleted Node.
	sp.announce(Route{netip.MustParsePrefix("10.244.1.0/24"), node2})
	l.waitRIB("ip", 5*time.Second, func(rib map[netip.Prefix]frr.Route) bool {
		_, gone := rib[netip.MustParsePrefix("10.244.2.0/24")]
		return via(rib, "10.244.1.0/24", node2) && !gone
	})
	l.waitRIB("ipv6", 5*time.Second, func(rib map[netip.Prefix]frr.Route) bool { return len(rib) == 0 })

	var sessions []Session
	if err := json.Unmarshal([]byte(sp.do("sessions")), &sessions); err != nil {
		t.Fatal(err)
	}
	if got := l.listening(); len(got) != 0 {
		t.Errorf("the speaker (without BFD) listens on %q, want no port", got)
	}
	if len(sessions) != 1 || !sessions[0].Established() || sessions[0].Peer != routerAddr || sessions[0].Announced != 1 {
		t.Errorf("sessions = %+v, want one established with %s, 1 route announced", sessions, routerAddr)
	}
}

// A speaker that stops gracefully and starts again (a CCM restart) must not
// cost the router a single route: they stay, marked stale, until the new
// session has sent them again.
func TestGracefulRestartKeepsRoutes(t *testing.T) {
	l := newLab(t, true)
	routes := []Route{{netip.MustParsePrefix("10.244.1.0/24"), node1}, {netip.MustParsePrefix("10.244.2.0/24"), node2}}
	sp := l.startSpeaker()
	sp.announce(routes...)
	both := func(rib map[netip.Prefix]frr.Route) bool {
		return via(rib, "10.244.1.0/24", node1) && via(rib, "10.244.2.0/24", node2)
	}
	l.waitSteady()
	l.waitRIB("ip", 5*time.Second, both)

	sp.do("stop graceful")
	<-sp.ended
	stopped := time.Now()
	next := l.startSpeaker()
	lost := 0
	for time.Since(stopped) < 3*time.Second {
		rib, err := l.router.BGPRoutes(context.Background(), "ip")
		if err != nil {
			t.Fatal(err)
		}
		if !both(rib) {
			lost++
			t.Errorf("%s after the stop the router lacks a route: %v", time.Since(stopped).Round(time.Millisecond), rib)
		}
		if lost > 3 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	next.announce(routes...)
	l.waitRIB("ip", 20*time.Second, both)
	waitState(t, l.router, speakerAddr, "Established", 20*time.Second)
	t.Logf("routes kept over a graceful restart, session re-established %s after the stop", time.Since(stopped).Round(time.Millisecond))
}

// A speaker whose host stops answering (frozen: no BGP keepalive, no BFD)
// must lose its routes at the router within BFD's detection time, not the
// hold time.
func TestBFDWithdrawsALostSpeaker(t *testing.T) {
	l := newLab(t, true)
	sp := l.startSpeaker()
	sp.announce(Route{netip.MustParsePrefix("10.244.1.0/24"), node1})
	l.waitSteady()
	l.waitRIB("ip", 5*time.Second, func(rib map[netip.Prefix]frr.Route) bool { return via(rib, "10.244.1.0/24", node1) })

	// GoBGP's BFD listens on UDP 3784 of every address (it can bind to
	// a device, not an address); nothing else listens.
	if got := l.listening(); !slices.Equal(got, []string{"udp *:3784"}) {
		t.Errorf("the speaker's namespace listens on %q, want only BFD's udp *:3784", got)
	}

	if err := sp.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	l.waitRIB("ip", 10*time.Second, func(rib map[netip.Prefix]frr.Route) bool { return len(rib) == 0 })
	gone := time.Since(frozen)
	_ = sp.cmd.Process.Signal(syscall.SIGCONT)
	t.Logf("routes left the router %s after the speaker froze", gone.Round(time.Millisecond))
	if gone > 3*time.Second {
		t.Errorf("routes left %s after the speaker froze; BFD (300 ms × 3) should take about 1 s", gone)
	}
}

// A peer that flaps (the router resets the session, as after its own
// restart or a policy change) gets every route again once the session is
// back, with no change on the speaker's side.
func TestPeerFlapReannounces(t *testing.T) {
	l := newLab(t, false)
	sp := l.startSpeaker()
	sp.announce(Route{netip.MustParsePrefix("10.244.1.0/24"), node1}, Route{netip.MustParsePrefix("fd00:244:1::/64"), node1v6})
	l.waitSteady()
	l.waitRIB("ip", 10*time.Second, func(rib map[netip.Prefix]frr.Route) bool { return via(rib, "10.244.1.0/24", node1) })
	for i := range 3 {
		if _, err := l.router.Vtysh(context.Background(), "clear bgp *"); err != nil {
			t.Fatal(err)
		}
		reset := time.Now()
		waitState(t, l.router, speakerAddr, "Established", 30*time.Second)
		l.waitRIB("ip", 10*time.Second, func(rib map[netip.Prefix]frr.Route) bool { return via(rib, "10.244.1.0/24", node1) })
		l.waitRIB("ipv6", 10*time.Second, func(rib map[netip.Prefix]frr.Route) bool { return via(rib, "fd00:244:1::/64", node1v6) })
		t.Logf("flap %d: the router had every route again %s after it reset the session", i+1, time.Since(reset).Round(time.Millisecond))
	}
}

// waitSteady waits until the router's session with the speaker has been
// established (and its BFD up) for a second and a half: FRR 8.4's bgpd
// re-keys its BFD session once BGP first comes up, and the old session's
// AdminDown makes GoBGP reset the session once.
func (l *lab) waitSteady() {
	l.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	steady := 0
	for steady < 15 {
		if time.Now().After(deadline) {
			l.t.Fatalf("the router's session with the speaker is not steady in 30 s")
		}
		time.Sleep(100 * time.Millisecond)
		st, err := l.router.NeighborState(ctx, speakerAddr)
		ok := err == nil && st == "Established"
		if ok && l.opts.Peers[0].BFD {
			out, err := l.router.Vtysh(ctx, "show bfd peer "+speakerAddr.String()+" json")
			ok = err == nil && strings.Contains(out, `"status":"up"`)
		}
		if !ok {
			steady = 0
			continue
		}
		steady++
	}
}

// listening lists the sockets listening in the speaker's namespace (its
// process is the only one in it), as "tcp|udp address:port".
func (l *lab) listening() []string {
	l.t.Helper()
	out, err := exec.Command("ip", "netns", "exec", l.speaker, "ss", "-Hlntu").Output()
	if err != nil {
		l.t.Fatalf("ss in the speaker's namespace: %v", err)
	}
	var got []string
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) >= 5 {
			got = append(got, f[0]+" "+f[4])
		}
	}
	slices.Sort(got)
	return got
}

func waitState(t *testing.T, r *frr.Router, peer netip.Addr, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		st, err := r.NeighborState(context.Background(), peer)
		if err == nil && st == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("router's session with %s: %q (%v), want %s", peer, st, err, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSpeakerProcess is the speaker side of the tests above, run by them in
// the speaker's namespace; on its own it does nothing.
func TestSpeakerProcess(t *testing.T) {
	conf := os.Getenv("LABCLOUD_BGP_SPEAKER")
	if conf == "" {
		t.Skip("run by the FRR tests in a namespace of their own")
	}
	var opts Options
	if err := json.Unmarshal([]byte(conf), &opts); err != nil {
		t.Fatal(err)
	}
	metrics.Register()
	s, err := Start(context.Background(), opts)
	if err != nil {
		fmt.Println("speaker: error:", err)
		return
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(nil, 1<<20)
	for in.Scan() {
		verb, arg, _ := strings.Cut(in.Text(), " ")
		switch verb {
		case "announce":
			var routes []Route
			if err := json.Unmarshal([]byte(arg), &routes); err != nil {
				fmt.Println("speaker: error:", err)
				continue
			}
			refused, err := s.Announce(routes)
			if err != nil {
				fmt.Println("speaker: error:", err)
				continue
			}
			fmt.Println("speaker: ok", strings.Join(refused, "; "))
		case "sessions":
			sessions, err := s.Sessions(context.Background())
			if err != nil {
				fmt.Println("speaker: error:", err)
				continue
			}
			b, _ := json.Marshal(sessions)
			fmt.Println("speaker: " + string(b))
		case "mem":
			fmt.Println("speaker: " + memory())
		case "metrics":
			fmt.Println("speaker: " + bgpMetrics())
		case "stop":
			s.Stop(arg == "graceful")
			fmt.Println("speaker: ok")
			return
		}
	}
}
