// Package placement decides which node answers each load-balancer VIP,
// and is the one writer of what this host's announcer answers.
//
// While this replica leads (Lead, then Run), every pass takes a snapshot
// (snapshot.go: the Nodes, their domains' facts and eligibility, the
// claimed VIPs and their Services' policies, each VIP's ranking by the
// pure lb.Place), decides what changes (decide.go: a pure function of the
// snapshot, the announcer's current answers and when each VIP's
// LocalPolicyDamping ends), and applies the changes to the announcer with
// their events, logs and metrics (pass.go), then programs the host's
// routes to VIPs (spread.go) and the Services' Announced conditions
// (conditions.go). Passes run on Sync (the service controller's calls),
// on every domain change, on Node and EndpointSlice changes that alter
// what a pass reads (watch.go), when a hypervisor comes back, when a hold,
// a damping or an endpoint's warm-up ends, and every Resync: the service
// controller does not call UpdateLoadBalancer on readiness changes, so
// this is what moves a VIP off a node that died.
//
// Placement is the one writer of what the announcer answers (answerer, answers.go):
// the leader's passes, or until this replica leads, with hypervisors on
// several hosts, the follower, which answers for its own host's nodes as
// the conditions the leader writes say (Follow, follow.go).
package placement

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
	"github.com/labcloud/labcloud/lb/announce"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/metrics"
	"github.com/labcloud/labcloud/provider/internal/follow"
)

// connectivity tells whether a hypervisor can be asked right now.
// *libvirtcloud.Hypervisor satisfies it.
type connectivity interface {
	Connected() bool
}

// Hypervisor is what placement needs of one hypervisor: the zone its
// domains are in. One that publishes domain events (follow.DomainEvents)
// starts a pass on each, and one that says whether it can be asked
// (Connected() bool) starts a pass when that changes.
// *libvirtcloud.Hypervisor does all three.
type Hypervisor interface {
	Zone() string
}

// Announcer makes one node answer for a VIP on the bridge.
// *announce.Announcer satisfies it.
type Announcer interface {
	// SetAfter makes mac answer for vip; cause, if not zero, is when the
	// libvirt event that moved it happened (timed to the first gratuitous
	// ARP as failover latency).
	SetAfter(vip netip.Addr, mac net.HardwareAddr, cause time.Time) error
	Remove(vip netip.Addr) error
	// Answering returns every VIP answered now and the MAC answering it.
	Answering() map[netip.Addr]net.HardwareAddr
	Owned(vip netip.Addr) (net.HardwareAddr, bool)
	Probe(ctx context.Context, vip netip.Addr) (owner net.HardwareAddr, taken bool, err error)
	// ProbeFor says whether the host at mac answers for ip (a guest's liveness).
	ProbeFor(ctx context.Context, ip netip.Addr, mac net.HardwareAddr) (answered bool, err error)
	Run(ctx context.Context) error
}

var _ Announcer = (*announce.Announcer)(nil)

// Resync is how often placement runs a pass with nothing changed;
// connectionPoll how often it checks that hypervisors answer.
const (
	Resync         = 30 * time.Second
	connectionPoll = 100 * time.Millisecond
)

// Config is what placement works with, fixed at construction.
type Config struct {
	// Bridge is the bridge VIPs are answered on, and the one the guests
	// of a hypervisor not in Bridges use.
	Bridge string
	// Bridges maps a hypervisor's zone to the bridge its guests use, if
	// not Bridge: a node's MAC is looked for there.
	Bridges     map[string]string
	Hypervisors []Hypervisor
	// Domain finds a Node's domain; it fails with libvirtcloud.ErrNotFound
	// only when the hypervisor says the domain does not exist.
	Domain func(ctx context.Context, n *v1.Node) (libvirtcloud.Domain, error)
	// Alloc is the one record of which VIPs exist and who holds them.
	Alloc *lb.Allocator
	// Announcer answers VIPs on this host's bridge; placement is its one
	// writer.
	Announcer Announcer
	// Here says which hypervisor zones are on this host, with hypervisors
	// on several hosts; nil: every VIP is answered here.
	Here map[string]bool
	// VIPRoutes programs the host's routes to VIPs; nil: ARP alone.
	VIPRoutes PathSetter
}

// settings are Config as placement reads it.
type settings struct {
	bridge      string
	bridges     map[string]string
	hypervisors []Hypervisor
	domain      func(ctx context.Context, n *v1.Node) (libvirtcloud.Domain, error)
	alloc       *lb.Allocator
	here        map[string]bool
	vipRoutes   PathSetter
	// localDamping is LocalPolicyDamping unless a test shortens it.
	localDamping time.Duration
	// localWarmup is LocalEndpointWarmup unless a test shortens it.
	localWarmup time.Duration
}

// Placement places every VIP while this replica leads, and is the one
// writer of what this host's announcer answers, leading or following.
type Placement struct {
	settings

	// Set by Lead.
	nodes    corelisters.NodeLister
	services corelisters.ServiceLister
	slices   discoverylisters.EndpointSliceLister
	synced   []cache.InformerSynced
	recorder record.EventRecorder
	conds    *conditions // writes the Services' Announced condition

	// follower answers for this host's nodes until Lead halts it; nil if
	// this replica does not follow.
	follower *follow.Follower

	kick chan struct{}
	// passing holds one token while a pass runs: one pass at a time, and
	// the pass owns known.
	passing chan struct{}
	// batchMu guards next: the calls waiting for the next pass.
	batchMu sync.Mutex
	next    *batch

	// answers is the one writer of the announcer: the follower's
	// answers until Lead, then every VIP's answer, on this host or
	// another, which the pass owns.
	answers *answerer
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

// New returns the placement of cfg, neither leading nor following yet.
func New(cfg Config) *Placement {
	p := &Placement{
		settings: settings{
			bridge: cfg.Bridge, bridges: cfg.Bridges, hypervisors: cfg.Hypervisors, domain: cfg.Domain, alloc: cfg.Alloc,
			here: cfg.Here, vipRoutes: cfg.VIPRoutes,
			localDamping: LocalPolicyDamping, localWarmup: LocalEndpointWarmup,
		},
		kick:         make(chan struct{}, 1),
		passing:      make(chan struct{}, 1),
		known:        map[string]nodeFacts{},
		dampedUntil:  map[netip.Addr]time.Time{},
		endpointAges: endpointAges{},
		reportAt:     map[string]time.Time{},
		awaiting:     map[string]bool{},
		answers:      newAnswerer(cfg.Announcer, cfg.Here),
	}
	p.live = newLiveness(cfg.Announcer.ProbeFor, p.poke)
	return p
}

// poke asks the loop for a pass; pokes coalesce.
func (p *Placement) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Run re-places every VIP on changes and every Resync until ctx ends; Lead
// comes first.
func (p *Placement) Run(ctx context.Context) {
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
	ticker := time.NewTicker(Resync)
	defer ticker.Stop()
	p.Sync(ctx, nil)
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
		p.Sync(ctx, nil)
	}
}

// watchConnections pokes a pass when a hypervisor answers again (its cache
// has been resynced by then, so placement is recomputed once from facts)
// and when it stops answering (its guests are probed from that pass on).
func (p *Placement) watchConnections(ctx context.Context) {
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

// key is a Service's key, namespace/name, as the allocator's holders and
// client-go's caches name it.
func key(svc *v1.Service) string { return cache.MetaObjectToName(svc).String() }

// splitKey is the namespace and name of the Service with key k.
func splitKey(k string) (namespace, name string) {
	namespace, name, _ = cache.SplitMetaNamespaceKey(k)
	return namespace, name
}

// batch is the calls waiting for the next pass.
type batch struct {
	given givenServices
	done  chan struct{} // closed once a pass has served the batch
}

// Sync returns after a pass that began after the call. svc is the service
// controller's copy of the Service it syncs; nil for a released Service
// and for the placement loop's own passes. Every pass places every VIP,
// so the calls that arrive while one runs share the next: a burst of N
// Services (up to --concurrent-service-syncs at once) takes a few passes,
// not N. The pass runs with the context of the call that starts it; all
// calls come from the controllers' one context.
func (p *Placement) Sync(ctx context.Context, svc *v1.Service) {
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
