package bgp

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"k8s.io/component-base/metrics/testutil"

	"github.com/labcloud/labcloud/metrics"
)

// These tests run the speaker in this process, its peer on a loopback
// port of this host (the speaker connects out; nothing else listens).

// loopbackSpeaker starts a speaker in this process whose one peer listens
// on ln, and announces a route so that it connects.
func loopbackSpeaker(t *testing.T, ln net.Listener) *Speaker {
	t.Helper()
	metrics.Register()
	port := ln.Addr().(*net.TCPAddr).Port
	s, err := Start(t.Context(), Options{ASN: speakerASN, RouterID: speakerAddr,
		Peers: []Peer{{Address: netip.MustParseAddr("127.0.0.1"), ASN: hostileASN, Port: uint16(port)}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop(false) })
	if _, err := s.Announce([]Route{{netip.MustParsePrefix("10.244.1.0/24"), node1}}); err != nil {
		t.Fatal(err)
	}
	return s
}

// A peer that takes each connection and drops it (not configured for
// the speaker, or refusing it) is tried at GoBGP's pace, every 2 s, for
// two windows of 10 s; then held down longer and longer between tries.
func TestSpeakerBacksOff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	start := time.Now()
	loopbackSpeaker(t, ln)
	var tries []time.Duration
	deadline := start.Add(48 * time.Second)
	for {
		_ = ln.(*net.TCPListener).SetDeadline(deadline)
		conn, err := ln.Accept()
		if err != nil {
			break
		}
		tries = append(tries, time.Since(start).Round(100*time.Millisecond))
		_ = conn.Close()
	}
	t.Logf("connection attempts at %v", tries)
	var early, late int
	for _, at := range tries {
		switch {
		case at < 20*time.Second:
			early++
		case at > 24*time.Second:
			late++
		}
	}
	// Every 2 s for 20 s, then (holds of 2 s, 4 s, each followed by
	// GoBGP's 5 s idle hold and its first dial 2 s later) two tries a
	// window: about 29 s, 31 s, 43 s, 45 s.
	if early < 6 {
		t.Errorf("%d connection attempts in the first 20 s, want GoBGP's pace (every 2 s)", early)
	}
	if late > 5 || late == 0 {
		t.Errorf("%d connection attempts from 24 s to 48 s, want 1 to 5 (held down between windows)", late)
	}
}

// labcloud_bgp_accepted_routes counts what the import policy keeps: none
// of what a peer sends, and what it would keep if it accepted.
func TestAcceptedRoutesCounted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	s := loopbackSpeaker(t, ln)
	h := acceptPeer(t, ln)
	h.send(updates([]netip.Prefix{netip.MustParsePrefix("198.18.0.1/32"), netip.MustParsePrefix("198.18.0.2/32")}, nil)...)
	accepted := func(want float64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			got, err := testutil.GetGaugeMetricValue(metrics.BGPAcceptedRoutes.WithLabelValues("127.0.0.1"))
			if err == nil && got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("labcloud_bgp_accepted_routes{peer=\"127.0.0.1\"} = %v (%v), want %v", got, err, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitReceived(t, s, 2)
	time.Sleep(1500 * time.Millisecond) // a tend
	accepted(0)

	// An import policy that accepted (which the speaker never sets).
	ctx := context.Background()
	if err := s.server.SetPolicyAssignment(ctx, &api.SetPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Direction: api.PolicyDirection_POLICY_DIRECTION_IMPORT, DefaultAction: api.RouteAction_ROUTE_ACTION_ACCEPT,
	}}); err != nil {
		t.Fatal(err)
	}
	if err := s.server.ResetPeer(ctx, &api.ResetPeerRequest{Address: "127.0.0.1", Soft: true, Direction: api.ResetPeerRequest_DIRECTION_IN}); err != nil {
		t.Fatal(err)
	}
	accepted(2)
}

func waitReceived(t *testing.T, s *Speaker, n uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		sessions, err := s.Sessions(t.Context())
		if err == nil && len(sessions) == 1 && sessions[0].Received == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sessions %+v (%v), want %d routes received", sessions, err, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
