package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/go-logr/logr"
	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/metrics"
)

// Speaker announces a set of routes to its peers. Announce replaces the
// whole set; peers are connected only after the first Announce, so that
// a restarted speaker's first update already holds every route and the
// peers' stale copies are replaced, not withdrawn and added again.
type Speaker struct {
	opts   Options
	server *server.BgpServer
	log    logr.Logger

	mu        sync.Mutex // serializes Announce and Stop; guards the fields below
	announced map[netip.Prefix]netip.Addr
	peered    map[netip.Addr]bool // peers added to the server
	stopped   bool

	stopTending context.CancelFunc // ends tend, which closes tended
	tended      chan struct{}
}

// Start runs a speaker. It stops when Stop is called, not when ctx ends:
// how it stops (gracefully or not) is the caller's choice.
func Start(ctx context.Context, opts Options) (*Speaker, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.RestartTime == 0 {
		opts.RestartTime = DefaultRestartTime
	}
	log := klog.FromContext(ctx).WithName("bgp")
	// GoBGP's own lines only from warnings up: watchSessions logs the
	// session changes.
	level := new(slog.LevelVar)
	level.Set(slog.LevelWarn)
	handler := minLevel{Handler: logr.ToSlogHandler(log), min: level}
	s := &Speaker{
		opts:      opts,
		server:    server.NewBgpServer(server.LoggerOption(slog.New(handler), level)),
		log:       log,
		announced: map[netip.Prefix]netip.Addr{},
		peered:    map[netip.Addr]bool{},
	}
	go s.server.Serve()
	err := s.server.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn:        opts.ASN,
		RouterId:   opts.RouterID.String(),
		ListenPort: -1, // connect out only: no privileged port, no collisions
	}})
	if err != nil {
		s.server.Stop()
		return nil, fmt.Errorf("start BGP speaker: %w", err)
	}
	if err := s.ownRoutesOnly(ctx); err != nil {
		s.server.Stop()
		return nil, err
	}
	if err := s.watchSessions(ctx); err != nil {
		s.server.Stop()
		return nil, err
	}
	metrics.BGPAnnouncedRoutes.Set(0)
	for _, p := range opts.Peers {
		metrics.BGPSessionUp.WithLabelValues(p.Address.String()).Set(0)
		metrics.BGPAcceptedRoutes.WithLabelValues(p.Address.String()).Set(0)
	}
	tendCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.stopTending, s.tended = stop, make(chan struct{})
	go func() {
		defer close(s.tended)
		s.tend(tendCtx)
	}()
	return s, nil
}

// Announce makes the announced routes exactly routes: new ones are
// announced, changed next hops replace the old, and the rest withdrawn.
// A bad route, or a prefix given two next hops, is refused alone (see
// normalize) and the rest announced; refused says why, a line each.
func (s *Speaker) Announce(routes []Route) (refused []string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, errors.New("BGP speaker stopped")
	}
	routes, refused = normalize(routes, s.announced)
	return refused, s.announce(routes)
}

// announce makes the announced routes exactly routes (normalized); s.mu
// is held.
func (s *Speaker) announce(routes []Route) error {
	d := diffRoutes(s.announced, routes)
	if len(d.announce) > 0 {
		paths := make([]*apiutil.Path, 0, len(d.announce))
		for _, r := range d.announce {
			p, err := s.path(r)
			if err != nil {
				return err
			}
			paths = append(paths, p)
		}
		if _, err := s.server.AddPath(apiutil.AddPathRequest{Paths: paths}); err != nil {
			return fmt.Errorf("announce %d routes: %w", len(paths), err)
		}
		for _, r := range d.announce {
			s.announced[r.Prefix] = r.NextHop
		}
	}
	if len(d.withdraw) > 0 {
		paths := make([]*apiutil.Path, 0, len(d.withdraw))
		for _, p := range d.withdraw {
			path, err := s.path(Route{Prefix: p, NextHop: s.announced[p]})
			if err != nil {
				return err
			}
			paths = append(paths, path)
		}
		if err := s.server.DeletePath(apiutil.DeletePathRequest{Paths: paths}); err != nil {
			return fmt.Errorf("withdraw %d routes: %w", len(paths), err)
		}
		for _, p := range d.withdraw {
			delete(s.announced, p)
		}
	}
	metrics.BGPAnnouncedRoutes.Set(float64(len(s.announced)))
	if len(d.announce)+len(d.withdraw) > 0 {
		s.log.V(2).Info("Routes changed", "announced", len(d.announce), "withdrawn", len(d.withdraw), "total", len(s.announced))
	}
	return s.addPeers()
}

// Stop ends every session. Gracefully, peers keep this speaker's routes
// for the restart time (no NOTIFICATION is sent), which is how a restart
// loses none; the process is then expected to exit, as GoBGP's BFD
// listener stays open. Otherwise peers are told and drop the routes.
func (s *Speaker) Stop(gracefully bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	s.stopped = true
	s.stopTending()
	<-s.tended
	if gracefully {
		if err := s.server.StopBgp(context.Background(), &api.StopBgpRequest{AllowGracefulRestart: true}); err != nil {
			s.log.Error(err, "Could not stop the BGP speaker gracefully")
		}
	} else {
		s.server.Stop()
	}
	for _, p := range s.opts.Peers {
		metrics.BGPSessionUp.DeleteLabelValues(p.Address.String())
		metrics.BGPAcceptedRoutes.DeleteLabelValues(p.Address.String())
	}
}

// ownRoutesOnly makes the speaker keep and send only the routes it
// originates (Announce's): the global import policy, which GoBGP applies
// to every path entering its RIB, and the export policy, applied to every
// path sent to a peer, accept local paths and reject the rest. Nothing a
// peer sends is used or passed on; GoBGP still holds it in the peer's
// Adj-RIB-In, which the prefix limit bounds (peerConfig).
func (s *Speaker) ownRoutesOnly(ctx context.Context) error {
	own := &api.Policy{Name: "labcloud-own-routes", Statements: []*api.Statement{{
		Name:       "labcloud-local",
		Conditions: &api.Conditions{RouteType: api.Conditions_ROUTE_TYPE_LOCAL},
		Actions:    &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_ACCEPT},
	}}}
	if err := s.server.AddPolicy(ctx, &api.AddPolicyRequest{Policy: own}); err != nil {
		return fmt.Errorf("add the BGP speaker's policy: %w", err)
	}
	for _, dir := range []api.PolicyDirection{api.PolicyDirection_POLICY_DIRECTION_IMPORT, api.PolicyDirection_POLICY_DIRECTION_EXPORT} {
		err := s.server.SetPolicyAssignment(ctx, &api.SetPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
			Direction: dir, Policies: []*api.Policy{{Name: own.Name}}, DefaultAction: api.RouteAction_ROUTE_ACTION_REJECT,
		}})
		if err != nil {
			return fmt.Errorf("assign the BGP speaker's %s policy: %w", dir, err)
		}
	}
	return nil
}

// path is the GoBGP path for r, with the configured attributes.
func (s *Speaker) path(r Route) (*apiutil.Path, error) {
	nlri, err := gobgp.NewIPAddrPrefix(r.Prefix)
	if err != nil {
		return nil, fmt.Errorf("route %s: %w", r, err)
	}
	attrs := []gobgp.PathAttributeInterface{gobgp.NewPathAttributeOrigin(gobgp.BGP_ORIGIN_ATTR_TYPE_IGP)}
	family := gobgp.RF_IPv4_UC
	if r.Prefix.Addr().Is4() {
		hop, err := gobgp.NewPathAttributeNextHop(r.NextHop)
		if err != nil {
			return nil, fmt.Errorf("route %s: %w", r, err)
		}
		attrs = append(attrs, hop)
	} else {
		family = gobgp.RF_IPv6_UC
		reach, err := gobgp.NewPathAttributeMpReachNLRI(family, []gobgp.PathNLRI{{NLRI: nlri}}, r.NextHop)
		if err != nil {
			return nil, fmt.Errorf("route %s: %w", r, err)
		}
		attrs = append(attrs, reach)
	}
	if len(s.opts.Communities) > 0 {
		attrs = append(attrs, gobgp.NewPathAttributeCommunities(s.opts.Communities))
	}
	if s.opts.LocalPreference != 0 {
		// GoBGP sends LOCAL_PREF to internal peers only.
		attrs = append(attrs, gobgp.NewPathAttributeLocalPref(s.opts.LocalPreference))
	}
	return &apiutil.Path{Family: family, Nlri: nlri, Attrs: attrs}, nil
}

// addPeers adds the peers not added yet (all of them on the first
// Announce, so a failure part-way retries only the rest), each with
// graceful restart for both families: the restart flag and each family's
// forwarding flag are set on every start, because the forwarding state
// (the nodes) outlives this process, so peers keep the previous
// session's routes until this one has sent its own.
func (s *Speaker) addPeers() error {
	for _, p := range s.opts.Peers {
		if s.peered[p.Address] {
			continue
		}
		if err := s.server.AddPeer(context.Background(), &api.AddPeerRequest{Peer: s.peerConfig(p)}); err != nil {
			return fmt.Errorf("add BGP peer %s: %w", p.Address, err)
		}
		s.peered[p.Address] = true
	}
	return nil
}

func (s *Speaker) peerConfig(p Peer) *api.Peer {
	restart := uint32(s.opts.RestartTime / time.Second)
	families := make([]*api.AfiSafi, 0, 2)
	for _, afi := range []api.Family_Afi{api.Family_AFI_IP, api.Family_AFI_IP6} {
		family := &api.Family{Afi: afi, Safi: api.Family_SAFI_UNICAST}
		families = append(families, &api.AfiSafi{
			Config:            &api.AfiSafiConfig{Family: family, Enabled: true},
			MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}},
			PrefixLimits:      &api.PrefixLimit{Family: family, MaxPrefixes: maxPrefixes, ShutdownThresholdPct: prefixWarnPct},
		})
	}
	c := &api.Peer{
		Conf: &api.PeerConf{NeighborAddress: p.Address.String(), PeerAsn: p.ASN, AuthPassword: p.Password},
		GracefulRestart: &api.GracefulRestart{
			Enabled: true, RestartTime: restart, NotificationEnabled: true,
			LocalRestarting: true, DeferralTime: deferralTime,
		},
		AfiSafis: families,
		Timers:   &api.Timers{Config: &api.TimersConfig{ConnectRetry: connectRetry, IdleHoldTimeAfterReset: idleAfterReset}},
	}
	if p.Port != 0 {
		c.Transport = &api.Transport{RemotePort: uint32(p.Port)}
	}
	if p.HoldTime != 0 {
		c.Timers.Config.HoldTime = uint64(p.HoldTime / time.Second)
		c.Timers.Config.KeepaliveInterval = uint64(p.HoldTime / time.Second / 3)
	}
	if p.EBGPMultihop != 0 {
		c.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: uint32(p.EBGPMultihop)}
	}
	if p.BFD {
		c.Bfd = &api.BfdPeerConfig{
			Enabled:                  true,
			DesiredMinimumTxInterval: uint32(bfdInterval / time.Microsecond),
			RequiredMinimumReceive:   uint32(bfdInterval / time.Microsecond),
			DetectionMultiplier:      bfdDetectMultiplier,
		}
	}
	return c
}

// maxPrefixes bounds the routes the speaker holds from one peer, per
// address family. It keeps none (ownRoutesOnly), but GoBGP holds what a
// peer sends in its Adj-RIB-In all the same; a peer that sends more has
// its session shut down (a Cease NOTIFICATION, "maximum number of
// prefixes reached") and retried with the back-off of reconnects.
const maxPrefixes = 5000

// prefixWarnPct is the share of maxPrefixes at which GoBGP logs a warning.
const prefixWarnPct = 80

const (
	// connectRetry is the wait between connection attempts (seconds;
	// GoBGP's default is 120, which would leave a router that restarts
	// without our routes for two minutes); the pacer (reconnect.go) holds
	// a peer that keeps failing down between attempts.
	connectRetry = 2
	// idleAfterReset is the wait before reconnecting after a reset
	// (seconds; GoBGP's default is 30). A BFD flap resets the session:
	// FRR 8.4's bgpd replaces its BFD session once BGP is up, and GoBGP
	// takes the old session's AdminDown as the peer going down.
	idleAfterReset = 1
	// deferralTime bounds how long a restarted speaker waits for its
	// peers' End-of-RIB before it sends its own routes (seconds).
	deferralTime = 5
)

// minLevel drops records below min, which logr's handler would pass on
// by its own verbosity instead.
type minLevel struct {
	slog.Handler
	min slog.Leveler
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min.Level() && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{Handler: h.Handler.WithAttrs(attrs), min: h.min}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{Handler: h.Handler.WithGroup(name), min: h.min}
}
