package provider

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/metrics"
	"github.com/labcloud/labcloud/provider/internal/follow"
)

// Placement and failover: which node answers each VIP. Every pass takes a
// snapshot (placement_snapshot.go: the Nodes, their domains' facts and
// eligibility, the claimed VIPs and their Services' policies, each VIP's
// ranking by the pure lb.Place), decides what changes (placement_decide.go:
// a pure function of the snapshot, the announcer's current answers and
// when each VIP's LocalPolicyDamping ends), and applies the changes to the
// announcer with their events, logs and metrics (placement_pass.go).
// Passes run on EnsureLoadBalancer and friends, on every domain change, on
// Node and EndpointSlice changes that alter what a pass reads
// (placement_watch.go), when a hypervisor comes back, when a hold, a
// damping or an endpoint's warm-up ends, and periodically: the service
// controller does not call UpdateLoadBalancer on readiness changes, so
// this is what moves a VIP off a node that died.

// connectivity tells whether a hypervisor can be asked right now.
// *libvirtcloud.Hypervisor satisfies it.
type connectivity interface {
	Connected() bool
}

// PlacementResync is how often placement runs a pass with nothing
// changed; connectionPoll how often it checks that hypervisors answer.
const (
	PlacementResync = 30 * time.Second
	connectionPoll  = 100 * time.Millisecond
)

// placementConfig is what placement works with, fixed at construction.
type placementConfig struct {
	bridge      string
	bridges     map[string]string // by zone: the bridge each hypervisor's guests use, if not bridge
	hypervisors []Hypervisor
	instances   *instances
	alloc       *lb.Allocator
	ann         Announcer
	// here says which hypervisor zones are on this host, with hypervisors
	// on several hosts; nil: every VIP is answered here.
	here      map[string]bool
	vipRoutes pathSetter // the host's routes to VIPs; nil: ARP alone
	// localDamping is LocalPolicyDamping unless a test shortens it.
	localDamping time.Duration
	// localWarmup is LocalEndpointWarmup unless a test shortens it.
	localWarmup time.Duration
}

type placement struct {
	placementConfig

	// Set by watch.
	nodes    corelisters.NodeLister
	services corelisters.ServiceLister
	slices   discoverylisters.EndpointSliceLister
	synced   []cache.InformerSynced
	recorder record.EventRecorder
	conds    *conditions // writes the Services' Announced condition

	kick chan struct{}
	// passing holds one token while a pass runs: one pass at a time, and
	// the pass owns known.
	passing chan struct{}
	// batchMu guards next: the calls waiting for the next pass.
	batchMu sync.Mutex
	next    *batch

	// answers is every VIP's answer, on this host or another; the pass
	// owns it.
	answers *answerSplit
	// known holds each Node's last facts, used while its hypervisor
	// cannot be asked: an unreachable hypervisor is not a dead node.
	known map[string]nodeFacts
	// live probes the guests whose hypervisor cannot be asked: a lost
	// host's are.
	live *liveness
	// holdTimer pokes a pass when the earliest UnknownHold of the last
	// pass is over; the pass owns it.
	holdTimer *time.Timer
	// routesCheckedAt is when a pass last read the kernel's routes to VIPs
	// (routeCheckInterval); the pass owns it.
	routesCheckedAt time.Time
	// snap is the last pass's snapshot, whose slices and maps the next
	// reuses; the pass owns it.
	snap snapshot
	// dampedUntil is, for each VIP this process has set on a node, when
	// the localDamping after that set ends; the pass owns it.
	dampedUntil map[netip.Addr]time.Time
	// endpointAges is when each Local-policy Service's ready endpoints
	// were first seen on their nodes (LocalEndpointWarmup); the pass owns
	// it.
	endpointAges endpointAges

	mu sync.Mutex
	// reportAt is when this process saw a Node's Ready report change, by
	// the host's clock: a node whose domain went down (nodeFacts.lastDown)
	// since its last report is still booting, whatever its stale Ready
	// says. A report from before the watch began counts from its own
	// heartbeat less heartbeatSkew.
	reportAt map[string]time.Time // by Node name
	// awaiting are the candidate Nodes the last pass found ineligible only
	// because they had not reported since their domain was down: their
	// next report, a heartbeat placement otherwise ignores, starts a pass.
	awaiting map[string]bool
}

func newPlacement(cfg placementConfig) *placement {
	if cfg.localDamping == 0 {
		cfg.localDamping = LocalPolicyDamping
	}
	if cfg.localWarmup == 0 {
		cfg.localWarmup = LocalEndpointWarmup
	}
	p := &placement{
		placementConfig: cfg,
		kick:            make(chan struct{}, 1),
		passing:         make(chan struct{}, 1),
		known:           map[string]nodeFacts{},
		dampedUntil:     map[netip.Addr]time.Time{},
		endpointAges:    endpointAges{},
		reportAt:        map[string]time.Time{},
		awaiting:        map[string]bool{},
		answers:         newAnswerSplit(cfg.ann, cfg.here),
	}
	p.live = newLiveness(func(ctx context.Context, ip netip.Addr, mac net.HardwareAddr) (bool, error) {
		return p.ann.ProbeFor(ctx, ip, mac)
	}, p.poke)
	return p
}

// poke asks the loop for a pass; pokes coalesce.
func (p *placement) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// run re-places every VIP on changes and periodically until ctx ends.
func (p *placement) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, h := range p.hypervisors {
		if src, ok := h.(follow.DomainEvents); ok {
			follow.OnDomainEvents(ctx, &wg, src, p.poke)
		}
	}
	wg.Go(func() { p.watchConnections(ctx) })
	wg.Go(func() { p.live.run(ctx) })
	wg.Go(func() { p.conds.run(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), p.synced...) {
		return
	}
	ticker := time.NewTicker(PlacementResync)
	defer ticker.Stop()
	p.sync(ctx, nil)
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-ticker.C:
		}
		// select picks at random among ready cases: a kick or a tick
		// pending when ctx ends must not start one more pass.
		if ctx.Err() != nil {
			return
		}
		p.sync(ctx, nil)
	}
}

// watchConnections pokes a pass when a hypervisor answers again (its cache
// has been resynced by then, so placement is recomputed once from facts)
// and when it stops answering (its guests are probed from that pass on).
func (p *placement) watchConnections(ctx context.Context) {
	up := make([]bool, len(p.hypervisors))
	t := time.NewTicker(connectionPoll)
	defer t.Stop()
	for {
		for i, h := range p.hypervisors {
			c, ok := h.(connectivity)
			if !ok {
				continue
			}
			connected := c.Connected()
			switch {
			case connected && !up[i]:
				klog.FromContext(ctx).V(2).Info("Hypervisor answers; re-placing VIPs", "zone", h.Zone())
				p.poke()
			case !connected && up[i]:
				klog.FromContext(ctx).Info("Hypervisor cannot be asked; probing its guests on the bridge", "zone", h.Zone())
				p.poke()
			}
			up[i] = connected
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// givenServices are the Services whose service-controller calls a pass
// serves, by key: each call's copy, possibly newer than the cache's.
type givenServices map[string]*v1.Service

// batch is the calls waiting for the next pass.
type batch struct {
	given givenServices
	done  chan struct{} // closed once a pass has served the batch
}

// sync returns after a pass that began after the call. svc is the service
// controller's copy of the Service it syncs; nil for a released Service
// and for the placement loop's own passes. Every pass places every VIP,
// so the calls that arrive while one runs share the next: a burst of N
// Services (up to --concurrent-service-syncs at once) takes a few passes,
// not N. The pass runs with the context of the call that starts it; all
// calls come from the controllers' one context.
func (p *placement) sync(ctx context.Context, svc *v1.Service) {
	p.batchMu.Lock()
	b := p.next
	if b == nil {
		b = &batch{given: givenServices{}, done: make(chan struct{})}
		p.next = b
	}
	if svc != nil {
		b.given[key(svc)] = svc // one worker per key: no older copy to keep
	}
	p.batchMu.Unlock()

	select {
	case <-b.done:
		return
	case p.passing <- struct{}{}:
	}
	defer func() { <-p.passing }()
	p.batchMu.Lock()
	taken := p.next != b
	if !taken {
		p.next = nil
	}
	p.batchMu.Unlock()
	if taken {
		// Another call ran this batch's pass, which closed done before
		// giving up the token just taken.
		return
	}
	start := time.Now()
	p.pass(ctx, b.given)
	metrics.PlacementPassSeconds.Observe(time.Since(start).Seconds())
	close(b.done)
}
