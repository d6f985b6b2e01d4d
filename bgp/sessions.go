package bgp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"

	"github.com/labcloud/labcloud/metrics"
)

// Session is one peer's state as the speaker sees it.
type Session struct {
	Peer netip.Addr
	ASN  uint32
	// State is the BGP FSM state: "idle", "connect", "active",
	// "opensent", "openconfirm" or "established".
	State string
	// Since is when the session was last established (zero if never).
	Since time.Time
	// Announced is how many routes were sent to the peer.
	Announced uint64
	// Received is how many routes the peer sent that the speaker holds
	// (its Adj-RIB-In, bounded by the prefix limit), Accepted how many of
	// them the import policy kept: none.
	Received, Accepted uint64
	// BFD is the BFD session's state ("up", "down", "init",
	// "admin_down"), empty without BFD.
	BFD string
	// Shut says the session is held down: the speaker backs off between
	// attempts, or the peer passed the prefix limit.
	Shut bool
}

// Established reports whether the session is up.
func (s Session) Established() bool { return s.State == "established" }

// Sessions lists every peer's session, by address.
func (s *Speaker) Sessions(ctx context.Context) ([]Session, error) {
	return s.sessions(ctx, true)
}

// sessions lists every peer's session; Announced is counted only if
// advertised says so (GoBGP then evaluates every route for each peer).
func (s *Speaker) sessions(ctx context.Context, advertised bool) ([]Session, error) {
	var out []Session
	err := s.server.ListPeer(ctx, &api.ListPeerRequest{EnableAdvertised: advertised}, func(p *api.Peer) {
		addr, _ := netip.ParseAddr(p.GetConf().GetNeighborAddress())
		sess := Session{Peer: addr, ASN: p.GetConf().GetPeerAsn(), State: sessionState(p.GetState().GetSessionState()),
			Shut: p.GetState().GetAdminState() != api.PeerState_ADMIN_STATE_UP}
		if up := p.GetTimers().GetState().GetUptime(); up != nil && sess.Established() {
			sess.Since = up.AsTime()
		}
		for _, f := range p.GetAfiSafis() {
			sess.Announced += f.GetState().GetAdvertised()
			sess.Received += f.GetState().GetReceived()
		}
		if b := p.GetState().GetBfdState(); b != nil && p.GetBfd().GetEnabled() {
			sess.BFD = bfdState(b.GetSessionState())
		}
		out = append(out, sess)
	})
	if err != nil {
		return nil, fmt.Errorf("list BGP sessions: %w", err)
	}
	accepted, err := s.acceptedRoutes()
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Accepted = accepted[out[i].Peer]
	}
	slices.SortFunc(out, func(a, b Session) int { return a.Peer.Compare(b.Peer) })
	return out, nil
}

// acceptedRoutes counts, per peer, the routes in the speaker's RIB that
// were learned from it: what the import policy kept.
func (s *Speaker) acceptedRoutes() (map[netip.Addr]uint64, error) {
	n := map[netip.Addr]uint64{}
	for _, f := range []gobgp.Family{gobgp.RF_IPv4_UC, gobgp.RF_IPv6_UC} {
		err := s.server.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: f}, func(_ gobgp.NLRI, paths []*apiutil.Path) {
			for _, p := range paths {
				if p.PeerAddress.IsValid() { // not one of ours
					n[p.PeerAddress]++
				}
			}
		})
		if err != nil {
			return nil, fmt.Errorf("list the BGP speaker's %s routes: %w", f, err)
		}
	}
	return n, nil
}

// watchSessions logs each session's changes and keeps
// labcloud_bgp_session_up current.
func (s *Speaker) watchSessions(ctx context.Context) error {
	wasUp := map[netip.Addr]bool{} // only the watcher's goroutine uses it
	err := s.server.WatchEvent(ctx, server.WatchEventMessageCallbacks{
		OnPeerUpdate: func(e *apiutil.WatchEventMessage_PeerEvent, _ time.Time) {
			if e.Type != apiutil.PEER_EVENT_STATE {
				return
			}
			st := e.Peer.State
			up := st.SessionState == gobgp.BGP_FSM_ESTABLISHED
			peer := st.NeighborAddress.String()
			metrics.BGPSessionUp.WithLabelValues(peer).Set(boolGauge(up))
			was := wasUp[st.NeighborAddress]
			wasUp[st.NeighborAddress] = up
			switch {
			case up && !was:
				s.log.Info("BGP session established", "peer", peer, "peerASN", st.PeerASN)
			case !up && was:
				s.log.Info("BGP session down", "peer", peer, "state", sessionState(apiState(st.SessionState)),
					"reason", st.DisconnectReason.String(), "message", st.DisconnectMessage)
			}
		},
	}, server.WatchPeer())
	if err != nil {
		return fmt.Errorf("watch BGP sessions: %w", err)
	}
	return nil
}

// tend, every second until ctx ends, paces each peer's reconnects
// (pacer) and keeps labcloud_bgp_accepted_routes current.
func (s *Speaker) tend(ctx context.Context) {
	pacers := map[netip.Addr]*pacer{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		sessions, err := s.sessions(ctx, false)
		for _, sess := range sessions {
			err = errors.Join(err, s.pace(ctx, pacers, sess))
		}
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if msg != "" && msg != lastErr && ctx.Err() == nil { // once until it changes
			s.log.Error(err, "Could not tend the BGP sessions")
		}
		lastErr = msg
	}
}

// pace steps the peer's pacer and does what it says, and sets the peer's
// accepted routes.
func (s *Speaker) pace(ctx context.Context, pacers map[netip.Addr]*pacer, sess Session) error {
	peer := sess.Peer.String()
	metrics.BGPAcceptedRoutes.WithLabelValues(peer).Set(float64(sess.Accepted))
	now := time.Now()
	p := pacers[sess.Peer]
	if p == nil {
		p = newPacer(now)
		pacers[sess.Peer] = p
	}
	switch p.step(sess.Established(), !sess.Shut, now) {
	case paceDisable:
		log := s.log.V(2)
		if p.failures == 2 { // the first hold of a run of failures
			log = s.log
		}
		log.Info("BGP peer not established; holding it down before the next attempt", "peer", peer,
			"for", p.heldUntil.Sub(now), "failedAttempts", p.failures)
		if err := s.server.DisablePeer(ctx, &api.DisablePeerRequest{Address: peer}); err != nil {
			return fmt.Errorf("hold BGP peer %s down: %w", peer, err)
		}
	case paceEnable:
		if err := s.server.EnablePeer(ctx, &api.EnablePeerRequest{Address: peer}); err != nil {
			return fmt.Errorf("let BGP peer %s connect: %w", peer, err)
		}
	}
	return nil
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// apiState is the API's value of an FSM state: the same order, the API's
// counted from 1.
func apiState(s gobgp.FSMState) api.PeerState_SessionState {
	return api.PeerState_SessionState(s + 1)
}

func sessionState(s api.PeerState_SessionState) string {
	switch s {
	case api.PeerState_SESSION_STATE_IDLE:
		return "idle"
	case api.PeerState_SESSION_STATE_CONNECT:
		return "connect"
	case api.PeerState_SESSION_STATE_ACTIVE:
		return "active"
	case api.PeerState_SESSION_STATE_OPENSENT:
		return "opensent"
	case api.PeerState_SESSION_STATE_OPENCONFIRM:
		return "openconfirm"
	case api.PeerState_SESSION_STATE_ESTABLISHED:
		return "established"
	}
	return "unknown"
}

func bfdState(s api.BfdSessionState) string {
	switch s {
	case api.BfdSessionState_BFD_SESSION_STATE_UP:
		return "up"
	case api.BfdSessionState_BFD_SESSION_STATE_DOWN:
		return "down"
	case api.BfdSessionState_BFD_SESSION_STATE_INIT:
		return "init"
	case api.BfdSessionState_BFD_SESSION_STATE_ADMIN_DOWN:
		return "admin_down"
	}
	return "unknown"
}
