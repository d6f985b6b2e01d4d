package announce

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/arp"
)

// answer asks f's segment for vip and returns the answering MAC's string,
// "" if nothing answers within d.
func (f *fixture) answer(d time.Duration) string {
	f.st.tb.Helper()
	f.st.request(vip)
	for {
		p, _, err := f.st.read(d)
		if err != nil {
			return ""
		}
		if p.SenderIP == vip && p.TargetIP != vip {
			return p.SenderHardwareAddr.String()
		}
	}
}

// TestRoleOneAnswererAtATime: two replicas on one host (one neighbour
// table). The leader answers and the other does not; when the leader goes
// (its names are freed, as on SIGKILL) the other answers at once with the
// leader's recorded MAC; when a leader is back, the stand-in stops first.
func TestRoleOneAnswererAtATime(t *testing.T) {
	id := fmt.Sprintf("test-%d", time.Now().UnixNano())
	opts := testOptions()
	leader, standby := newFixture(t, opts), newFixture(t, opts)
	standby.a.neigh = leader.neigh // one host, one neighbour table
	all := func(netip.Addr) bool { return true }
	ctx := testContext(t)

	rl := NewRole(leader.a, id, all)
	rl.Stand(ctx)
	leader.run()
	leadCtx, die := context.WithCancel(ctx)
	if err := rl.Lead(leadCtx); err != nil {
		t.Fatal(err)
	}
	if err := leader.a.Set(vip, node1MAC); err != nil {
		t.Fatal(err)
	}
	leader.settle(vip, node1MAC)

	rs := NewRole(standby.a, id, all)
	rs.poll = 10 * time.Millisecond
	rs.Stand(ctx)
	standby.run()
	time.Sleep(100 * time.Millisecond)
	if got := standby.answer(200 * time.Millisecond); got != "" {
		t.Fatalf("a replica that does not lead answered %s while the leader lives", got)
	}
	if got := leader.answer(wait); got != node1MAC.String() {
		t.Fatalf("leader answered %q, want %s", got, node1MAC)
	}

	die()
	start := time.Now()
	var got string
	for time.Since(start) < time.Second && got == "" {
		got = standby.answer(50 * time.Millisecond)
	}
	if got != node1MAC.String() {
		t.Fatalf("after the leader died the stand-in answered %q, want the recorded %s", got, node1MAC)
	}
	t.Logf("stand-in answered %v after the leader went", time.Since(start).Round(time.Millisecond))
	if n := standby.a.Stats().Gratuitous; n != 0 {
		t.Errorf("the stand-in sent %d gratuitous frames, want none", n)
	}

	// The stand-in becomes the leader in its own process: no gap.
	if err := rs.Lead(ctx); err != nil {
		t.Fatal(err)
	}
	if got := standby.answer(wait); got != node1MAC.String() {
		t.Fatalf("new leader answered %q, want %s", got, node1MAC)
	}
	if mac, ok := standby.a.Owned(vip); !ok || !bytes.Equal(mac, node1MAC) {
		t.Errorf("new leader owns %v %v", mac, ok)
	}

	// A third replica standing by never answers while a leader lives.
	other := newFixture(t, opts)
	other.a.neigh = leader.neigh
	ro := NewRole(other.a, id, all)
	ro.poll = 10 * time.Millisecond
	ro.Stand(ctx)
	other.run()
	time.Sleep(100 * time.Millisecond)
	if got := other.answer(200 * time.Millisecond); got != "" {
		t.Fatalf("a third replica answered %s while a leader lives", got)
	}
}

func everyVIP(netip.Addr) bool { return true }

// onOneHost returns two replicas' fixtures on one host (one neighbour
// table), whose record says mac last answered for vip.
func onOneHost(t *testing.T, mac net.HardwareAddr) (*fixture, *fixture) {
	t.Helper()
	a, b := newFixture(t, testOptions()), newFixture(t, testOptions())
	b.a.neigh = a.neigh
	if err := a.neigh.NeighSet(a.a.neighbour(vip, mac)); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// TestRoleLeaderWaitsForStandIn: a leader in another process waits until
// the stand-in has stopped answering.
func TestRoleLeaderWaitsForStandIn(t *testing.T) {
	id := fmt.Sprintf("test-%d", time.Now().UnixNano())
	a, b := onOneHost(t, node2MAC)
	ctx := testContext(t)
	rs := NewRole(a.a, id, everyVIP)
	rs.poll = 10 * time.Millisecond
	rs.Stand(ctx)
	a.run()
	if _, ok := waitFor(time.Second, func() bool { return a.a.handover.active() }); !ok {
		t.Fatal("no stand-in with no leader")
	}
	if got := a.answer(wait); got != node2MAC.String() {
		t.Fatalf("stand-in answered %q, want the recorded %s", got, node2MAC)
	}
	rl := NewRole(b.a, id, everyVIP)
	rl.Stand(ctx)
	b.run()
	if err := rl.Lead(ctx); err != nil {
		t.Fatal(err)
	}
	if a.a.handover.active() {
		t.Fatal("the stand-in still answers once the leader holds the bridge")
	}
	if len(a.a.Answering()) != 0 {
		t.Errorf("the stand-in kept %v", a.a.Answering())
	}
}

// roleChildEnv names the role a child process of TestRoleKilledLeader
// holds the names under.
const roleChildEnv = "LABCLOUD_ROLE_CHILD_ID"

// TestRoleChildLeader is the leader's process of TestRoleKilledLeader: it
// holds "leader" and "host" as Lead does, says so, and waits to be killed.
func TestRoleChildLeader(t *testing.T) {
	id := os.Getenv(roleChildEnv)
	if id == "" {
		t.Skip("only run as TestRoleKilledLeader's child process")
	}
	r := NewRole(nil, id, nil)
	if _, err := claim(logr.Discard(), r.leader.base, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := claim(logr.Discard(), r.host.base, nil); err != nil {
		t.Fatal(err)
	}
	fmt.Println("holding")
	time.Sleep(time.Minute)
}

// startHolding starts a child process that prints "holding" once it holds
// its names, waits for that, and kills it at cleanup.
func startHolding(t *testing.T, child *exec.Cmd) {
	t.Helper()
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "holding\n" {
		t.Fatalf("%s: %q %v", child.Args, line, err)
	}
}

// TestRoleKilledLeader: the leader's process is SIGKILLed; the stand-in
// answers within milliseconds, by watching the leader's name rather than
// polling for it (its poll is an hour here), and a request that reached
// the bridge while nobody answered is answered too.
func TestRoleKilledLeader(t *testing.T) {
	id := fmt.Sprintf("test-%d", time.Now().UnixNano())
	f := newFixture(t, testOptions())
	if err := f.neigh.NeighSet(f.a.neighbour(vip, node1MAC)); err != nil {
		t.Fatal(err)
	}
	child := exec.Command(os.Args[0], "-test.run=^TestRoleChildLeader$", "-test.count=1")
	child.Env = append(os.Environ(), roleChildEnv+"="+id)
	startHolding(t, child)

	r := NewRole(f.a, id, func(netip.Addr) bool { return true })
	r.poll = time.Hour
	ctx := testContext(t)
	r.Stand(ctx)
	f.run()
	if got := f.answer(100 * time.Millisecond); got != "" {
		t.Fatalf("the stand-in answered %s while the leader lives", got)
	}
	f.st.drain()

	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	f.st.request(vip) // most likely before anyone answers again
	p, _, err := f.st.read(time.Second)
	if err != nil {
		t.Fatalf("the request sent as the leader was killed went unanswered: %v", err)
	}
	if p.SenderIP != vip || !bytes.Equal(p.SenderHardwareAddr, node1MAC) {
		t.Fatalf("answered %s is-at %s, want %s is-at %s", p.SenderIP, p.SenderHardwareAddr, vip, node1MAC)
	}
	took, ok := waitFor(time.Second, func() bool { return f.a.handover.active() })
	if !ok {
		t.Fatal("the stand-in is not answering a second after the leader was killed")
	}
	t.Logf("stand-in answering %v after SIGKILL (first answer after %v)", took, time.Since(killed).Round(time.Microsecond))
	if got := f.answer(wait); got != node1MAC.String() {
		t.Fatalf("stand-in answered %q, want the recorded %s", got, node1MAC)
	}
}

// TestSetActiveAnswersHeldRequests: a request read while inactive is
// answered when the Announcer becomes active soon after, and only then.
func TestSetActiveAnswersHeldRequests(t *testing.T) {
	f := newFixture(t, testOptions())
	f.a.SetActive(false)
	f.a.Adopt(map[netip.Addr]net.HardwareAddr{vip: node1MAC})
	f.run()
	f.st.request(vip)
	f.st.request(otherIP) // not owned: never answered
	f.st.quiet(100 * time.Millisecond)
	f.a.SetActive(true)
	p, _ := f.st.next(wait)
	if p.Operation != arp.OperationReply || p.SenderIP != vip || !bytes.Equal(p.SenderHardwareAddr, node1MAC) ||
		p.TargetIP != clientIP {
		t.Fatalf("got %v %s is-at %s to %s, want a reply %s is-at %s", p.Operation, p.SenderIP, p.SenderHardwareAddr, p.TargetIP, vip, node1MAC)
	}
	f.st.quiet(100 * time.Millisecond)

	// Going inactive forgets what was held.
	f.a.SetActive(false)
	f.st.request(vip)
	f.st.quiet(100 * time.Millisecond)
	f.a.SetActive(true)
	f.a.SetActive(false)
	f.st.drain()
	f.a.SetActive(true)
	f.st.quiet(100 * time.Millisecond)
}
