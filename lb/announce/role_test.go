package announce

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"
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

// TestRoleLeaderWaitsForStandIn: a leader in another process waits until
// the stand-in has stopped answering.
func TestRoleLeaderWaitsForStandIn(t *testing.T) {
	id := fmt.Sprintf("test-%d", time.Now().UnixNano())
	opts := testOptions()
	a, b := newFixture(t, opts), newFixture(t, opts)
	b.a.neigh = a.neigh
	if err := a.neigh.NeighSet(a.a.neighbour(vip, node2MAC)); err != nil {
		t.Fatal(err)
	}
	all := func(netip.Addr) bool { return true }
	ctx := testContext(t)
	rs := NewRole(a.a, id, all)
	rs.poll = 10 * time.Millisecond
	rs.Stand(ctx)
	a.run()
	if _, ok := waitFor(time.Second, func() bool { return a.a.active.Load() }); !ok {
		t.Fatal("no stand-in with no leader")
	}
	if got := a.answer(wait); got != node2MAC.String() {
		t.Fatalf("stand-in answered %q, want the recorded %s", got, node2MAC)
	}
	rl := NewRole(b.a, id, all)
	rl.Stand(ctx)
	b.run()
	if err := rl.Lead(ctx); err != nil {
		t.Fatal(err)
	}
	if a.a.active.Load() {
		t.Fatal("the stand-in still answers once the leader holds the bridge")
	}
	if len(a.a.Answering()) != 0 {
		t.Errorf("the stand-in kept %v", a.a.Answering())
	}
}
