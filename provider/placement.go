package provider

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	nodeutil "k8s.io/component-helpers/node/util"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/metrics"
)

// Placement and failover: which node answers each VIP. Every pass takes a
// snapshot (eligible nodes and their MACs, the allocator's VIPs, the
// announcer's current answers), calls the pure lb.Place, applies the
// difference to the announcer and emits events for it. Passes run on
// EnsureLoadBalancer and friends, on every domain change, on Node and
// EndpointSlice changes that alter what a pass reads, when a hypervisor
// comes back, and periodically: the service
// controller does not call UpdateLoadBalancer on readiness changes, so this
// is what moves a VIP off a node that died.

// DomainEvents is a hypervisor's stream of domain changes.
// *libvirtcloud.Hypervisor satisfies it.
type DomainEvents interface {
	Subscribe() (<-chan libvirtcloud.Event, func())
}

// connectivity tells whether a hypervisor can be asked right now.
// *libvirtcloud.Hypervisor satisfies it.
type connectivity interface {
	Connected() bool
}

// excludeLabel keeps a node out of load balancer pools, as upstream does.
const excludeLabel = "node.kubernetes.io/exclude-from-external-load-balancers"

// PlacementResync is how often placement runs a pass with nothing
// changed; connectionPoll how often it checks that hypervisors answer.
const (
	PlacementResync = 30 * time.Second
	connectionPoll  = 500 * time.Millisecond
)

// UnknownHold is how long a node whose Ready turned Unknown keeps the VIPs
// it answers, while its domain runs, even when other nodes are Ready. After
// a control-plane outage kube-controller-manager marks every Node Unknown
// at once, and the kubelets report again one by one within their 10 s
// status period: without the hold the first to report would take every
// VIP, and the others would take theirs back seconds later (two moves, and
// the connections through them cut, for a blip that never touched the
// data plane). A node whose kubelet really stopped loses its VIPs to a
// Ready node once the hold is over; with no Ready node it keeps them.
const UnknownHold = 30 * time.Second

// nodeFacts is what placement knows of one Node's domain.
type nodeFacts struct {
	uuid  string
	state libvirtcloud.State
	mac   net.HardwareAddr // the domain's NIC on the bridge; nil if none
	fresh bool             // from a hypervisor that answered in this pass
	// lastDown is when the domain cache saw the domain go down (host
	// clock). The cache runs from process start, so it also covers what
	// happened while this replica waited for the leader lease.
	lastDown time.Time
	// downEvent is when a libvirt event took the domain down; zero if it
	// runs or went down unseen by an event.
	downEvent time.Time
}

// heartbeatSkew is how far a guest's clock may be ahead of the host's: a
// Node report that predates this process's watch counts from its own
// heartbeat time less this.
const heartbeatSkew = 2 * time.Second

type placement struct {
	bridge    string
	hvs       []Hypervisor
	instances *instances
	alloc     *lb.Allocator
	ann       Announcer
	spread    pathSetter // the host's routes to VIPs; nil: ARP alone

	// Set by watch.
	nodes    corelisters.NodeLister
	services corelisters.ServiceLister
	slices   discoverylisters.EndpointSliceLister
	synced   []cache.InformerSynced
	recorder record.EventRecorder
	kick     chan struct{}
	conds    *conditions // writes the Services' Announced condition

	// passing holds one token while a pass runs: one pass at a time, and
	// the pass owns known.
	passing chan struct{}
	// batchMu guards next: the calls waiting for the next pass.
	batchMu sync.Mutex
	next    *batch

	// known holds each Node's last facts, used while its hypervisor
	// cannot be asked: an unreachable hypervisor is not a dead node.
	known map[string]nodeFacts
	// holdTimer pokes a pass when the earliest UnknownHold of the last
	// pass is over; the pass owns it.
	holdTimer *time.Timer
	// routesCheckedAt is when a pass last read the kernel's routes to VIPs
	// (routeCheckInterval); the pass owns it.
	routesCheckedAt time.Time
	// snap is the last pass's snapshot, whose maps the next reuses; the
	// pass owns it.
	snap snapshot

	mu sync.Mutex
	// reportAt is when this process saw a Node's Ready report change, by
	// the host's clock: a node whose domain went down (nodeFacts.lastDown)
	// since its last report is still booting, whatever its stale Ready
	// says. A report from before the watch began counts from its own
	// heartbeat less heartbeatSkew.
	reportAt map[string]time.Time // by Node name
	// awaiting are the Nodes the last pass found ineligible only because
	// they had not reported since their domain was down: their next
	// report, a heartbeat placement otherwise ignores, starts a pass.
	awaiting map[string]bool
}

func newPlacement(bridge string, hvs []Hypervisor, in *instances, alloc *lb.Allocator, ann Announcer) *placement {
	return &placement{
		bridge:    bridge,
		hvs:       hvs,
		instances: in,
		alloc:     alloc,
		ann:       ann,
		kick:      make(chan struct{}, 1),
		passing:   make(chan struct{}, 1),
		conds:     newConditions(),
		known:     map[string]nodeFacts{},
		reportAt:  map[string]time.Time{},
		awaiting:  map[string]bool{},
	}
}

// watch registers the informers placement reads and its event handlers;
// client writes the Services' Announced condition.
func (p *placement) watch(factory informers.SharedInformerFactory, recorder record.EventRecorder, client kubernetes.Interface) error {
	svcInf, nodeInf, sliceInf := factory.Core().V1().Services(), factory.Core().V1().Nodes(), factory.Discovery().V1().EndpointSlices()
	p.services, p.nodes, p.slices = svcInf.Lister(), nodeInf.Lister(), sliceInf.Lister()
	p.conds.client, p.conds.services = client, p.services
	p.synced = []cache.InformerSynced{svcInf.Informer().HasSynced, nodeInf.Informer().HasSynced, sliceInf.Informer().HasSynced}
	p.recorder = recorder
	if _, err := nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if n, ok := o.(*v1.Node); ok {
				p.mu.Lock()
				if _, seen := p.reportAt[n.Name]; !seen {
					if hb := readyHeartbeat(n); !hb.IsZero() {
						p.reportAt[n.Name] = hb.Add(-heartbeatSkew)
					}
				}
				p.mu.Unlock()
			}
			p.poke()
		},
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*v1.Node)
			nn, ok2 := n.(*v1.Node)
			if !ok1 || !ok2 {
				p.poke()
				return
			}
			awaited := false
			if readyReport(on) != readyReport(nn) {
				p.mu.Lock()
				p.reportAt[nn.Name] = time.Now()
				awaited = p.awaiting[nn.Name]
				p.mu.Unlock()
			}
			// Most Node updates change nothing a pass reads: heartbeats,
			// annotations (kube-controller-manager's TTL controller
			// rewrites every Node's as a cluster grows), other labels.
			// With 1000 Nodes a pass for each kept passes running back to
			// back, each taking every Node and dumping every VIP route.
			if awaited || placementInputsChanged(on, nn) {
				p.poke()
			}
		},
		DeleteFunc: func(o any) {
			if n, ok := o.(*v1.Node); ok {
				p.mu.Lock()
				delete(p.awaiting, n.Name)
				p.mu.Unlock()
			}
			p.poke()
		},
	}); err != nil {
		return err
	}
	// Endpoints move VIPs of Services with externalTrafficPolicy Local
	// only, and only when the nodes with a ready endpoint change: every
	// Pod's readiness anywhere in the cluster updates some EndpointSlice.
	_, err := sliceInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if p.localPolicy(o) {
				p.poke()
			}
		},
		UpdateFunc: func(o, n any) {
			old, ok1 := o.(*discoveryv1.EndpointSlice)
			cur, ok2 := n.(*discoveryv1.EndpointSlice)
			if !ok1 || !ok2 || p.localPolicy(cur) && !maps.Equal(readyNodes(old, nil), readyNodes(cur, nil)) {
				p.poke()
			}
		},
		DeleteFunc: func(o any) {
			if p.localPolicy(o) {
				p.poke()
			}
		},
	})
	return err
}

// localPolicy says whether obj is an EndpointSlice of a LoadBalancer
// Service with externalTrafficPolicy Local, or something else that may
// matter (a tombstone). A Service not yet in the cache starts its own pass
// when the service controller ensures it.
func (p *placement) localPolicy(obj any) bool {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return true
	}
	svc, err := p.services.Services(s.Namespace).Get(s.Labels[discoveryv1.LabelServiceName])
	return err == nil && svc.Spec.Type == v1.ServiceTypeLoadBalancer && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
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
	for _, h := range p.hvs {
		src, ok := h.(DomainEvents)
		if !ok {
			continue
		}
		ch, stop := src.Subscribe()
		wg.Go(func() {
			defer stop()
			for {
				select {
				case <-ctx.Done():
					return
				case _, ok := <-ch:
					if !ok {
						return
					}
					p.poke()
				}
			}
		})
	}
	wg.Go(func() { p.watchConnections(ctx) })
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

// watchConnections pokes a pass when a hypervisor answers again: its cache
// has been resynced by then, so placement is recomputed once from facts.
func (p *placement) watchConnections(ctx context.Context) {
	up := make([]bool, len(p.hvs))
	t := time.NewTicker(connectionPoll)
	defer t.Stop()
	for {
		for i, h := range p.hvs {
			c, ok := h.(connectivity)
			if !ok {
				continue
			}
			now := c.Connected()
			if now && !up[i] {
				klog.FromContext(ctx).V(2).Info("Hypervisor answers; re-placing VIPs", "zone", h.Zone())
				p.poke()
			}
			up[i] = now
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

// snapshot is one pass's view of the world. Each Node's view is kept once,
// in views, and the maps hold indexes into it: with 1000 Nodes, five maps
// from names (and MACs) to facts and Nodes took a megabyte, kept between
// passes and live in every pass of a burst.
type snapshot struct {
	unavailable bool // some hypervisor could not be asked
	// views are the Nodes listed now, then the last pass's facts of
	// domains whose MAC no listed Node's facts have now (a Node deleted,
	// a domain gone): what tells why a VIP left a node.
	views  []nodeView
	byName map[string]int32 // listed Nodes
	byMAC  map[macKey]int32 // by MAC: this pass's facts, else the last pass's
}

// nodeView is what a pass knows of one Node.
type nodeView struct {
	name  string
	node  *v1.Node  // nil in a view of the last pass's facts
	facts nodeFacts // if known
	known bool      // its domain's facts are known now (kept if its hypervisor cannot be asked)
	role  nodeRole
}

// nodeRole is what a listed Node with known facts may do, by its Node.
type nodeRole uint8

const (
	roleNone      nodeRole = iota
	roleCandidate          // Ready, not excluded, not being deleted: answers if its domain is eligible
	roleUnknown            // Ready is Unknown, not excluded, not being deleted
)

// macKey is a MAC on the bridge as a map key (libvirt's are EUI-48).
type macKey [6]byte

func keyOf(mac net.HardwareAddr) (macKey, bool) {
	var k macKey
	if len(mac) != len(k) {
		return k, false
	}
	copy(k[:], mac)
	return k, true
}

// view is the listed Node name's view.
func (s snapshot) view(name string) (nodeView, bool) {
	i, ok := s.byName[name]
	if !ok {
		return nodeView{}, false
	}
	return s.views[i], true
}

// holder is the view whose facts have mac: this pass's, else the last's.
func (s snapshot) holder(mac net.HardwareAddr) (nodeView, bool) {
	k, ok := keyOf(mac)
	if !ok {
		return nodeView{}, false
	}
	i, ok := s.byMAC[k]
	if !ok {
		return nodeView{}, false
	}
	return s.views[i], true
}

// candidate is the facts of Node name if it is a candidate.
func (s snapshot) candidate(name string) (nodeFacts, bool) {
	v, ok := s.view(name)
	return v.facts, ok && v.role == roleCandidate
}

// pass places every VIP and applies the result; its caller holds the
// passing token.
func (p *placement) pass(ctx context.Context, given givenServices) {
	if p.nodes == nil {
		return
	}
	// The service controller calls in once its own informers have synced,
	// not placement's (EndpointSlices are placement's alone): a pass over
	// a partial cache would withdraw or move VIPs that nothing changed, on
	// every new leader. run passes once they have synced.
	for _, synced := range p.synced {
		if !synced() {
			return
		}
	}
	log := klog.FromContext(ctx)
	snap := p.snapshot(ctx)
	defer clear(snap.views) // keeps no Node the informer has replaced
	vips := p.alloc.VIPs()
	var base []string
	for _, v := range snap.views {
		if v.role == roleCandidate && p.eligible(v.name, v.facts) {
			base = append(base, v.name)
		}
	}
	want := make(map[netip.Addr][]string, len(vips))
	holders := make(map[netip.Addr][]string, len(vips))
	for _, v := range vips {
		if !v.Claimed {
			continue
		}
		holders[v.IP] = v.Holders
		want[v.IP] = p.narrow(base, v.Holders, given)
	}
	// One ranking per VIP: its first node answers, and the spread route
	// goes via the first maxSpreadPaths.
	ranked := lb.Place(want, maxSpreadPaths)
	current := p.ann.Answering()
	started := time.Now()
	var holdEnds time.Time // the earliest UnknownHold that keeps a VIP from a Ready node

	for ip := range current {
		if _, held := holders[ip]; held {
			continue
		}
		if err := p.ann.Remove(ip); err != nil {
			log.Error(err, "Cannot stop announcing a released VIP", "ip", ip)
		}
	}
	for ip, hs := range holders {
		now := current[ip]
		from := snap.nodeWithMAC(now)
		var to string
		if r := ranked[ip]; len(r) > 0 {
			to = r[0]
		}
		// While a hypervisor cannot be asked, a VIP answered by a node
		// whose state is not known now stays where it is.
		if f, _ := snap.candidate(from); now != nil && snap.unavailable && (from == "" || !f.fresh) {
			continue
		}
		if now != nil {
			if until, ok := p.keepOnUnknown(snap, now, hs, given); ok && (to == "" || started.Before(until)) {
				if to != "" && (holdEnds.IsZero() || until.Before(holdEnds)) {
					holdEnds = until
				}
				continue
			}
		}
		if to == "" {
			if now == nil {
				p.eventOnce(hs, given, ip)
				continue
			}
			if err := p.ann.Remove(ip); err != nil {
				log.Error(err, "Cannot stop announcing VIP", "ip", ip)
				continue
			}
			p.event(hs, given, v1.EventTypeWarning, ReasonNoNode, "No eligible node (running domain on %s, Ready, not labelled node.kubernetes.io/exclude-from-external-load-balancers as kubeadm labels control planes, with endpoints for Local policy) can answer for %s", p.bridge, ip)
			continue
		}
		target, _ := snap.candidate(to)
		mac := target.mac
		if bytes.Equal(now, mac) {
			if len(given) > 0 {
				_ = p.ann.SetAfter(ip, mac, time.Time{}) // repairs a neighbour entry that failed before
			}
			continue
		}
		var (
			reason string
			cause  time.Time
		)
		if now != nil {
			reason, cause = p.moveReason(snap, now, want[ip])
		}
		if err := p.ann.SetAfter(ip, mac, cause); err != nil {
			log.Error(err, "Announcing VIP", "ip", ip, "node", to)
		}
		if now == nil {
			p.event(hs, given, v1.EventTypeNormal, ReasonAnnounced, "%s announced via node %s (%s)", ip, to, mac)
			continue
		}
		metrics.VIPMoves.WithLabelValues(reason).Inc()
		if h, ok := snap.holder(now); ok {
			from = h.name
		} else {
			from = now.String()
		}
		log.Info("VIP moved", "ip", ip, "from", from, "to", to, "mac", mac, "reason", reason)
		p.event(hs, given, v1.EventTypeNormal, ReasonMoved, "%s moved from node %s to node %s (%s)", ip, from, to, mac)
	}
	answering := p.ann.Answering() // after this pass's changes
	p.applySpread(ctx, snap, answering, ranked, holders, given)
	p.conds.update(answers(snap, answering, holders))
	p.wakeAt(holdEnds)
}

// wakeAt pokes a pass at t (none if t is zero), replacing the last pass's.
func (p *placement) wakeAt(t time.Time) {
	if p.holdTimer != nil {
		p.holdTimer.Stop()
	}
	if !t.IsZero() {
		p.holdTimer = time.AfterFunc(time.Until(t), p.poke)
	}
}

// keepOnUnknown says whether the VIP answered by MAC now may stay with its
// node while the node is Unknown, and until when it keeps the VIP from a
// Ready node (its Ready's transition plus UnknownHold); when no node is
// eligible it keeps it for as long as that holds. It may stay if its Node
// is Unknown (kube-controller-manager stopped hearing from the kubelet),
// not reported NotReady, its domain runs, and the Services' policies allow
// it: withdrawing or moving every VIP after a control-plane outage would
// turn a blip into a data-plane outage.
func (p *placement) keepOnUnknown(snap snapshot, now net.HardwareAddr, holders []string, given givenServices) (time.Time, bool) {
	h, ok := snap.holder(now)
	if !ok {
		return time.Time{}, false
	}
	v, _ := snap.view(h.name)
	f := v.facts
	if v.role != roleUnknown || !f.fresh || !bytes.Equal(f.mac, now) || !p.eligible(h.name, f) ||
		!slices.Contains(p.narrow([]string{h.name}, holders, given), h.name) {
		return time.Time{}, false
	}
	return readyChanged(v.node).Add(UnknownHold), true
}

// moveReason tells why the node answering for a VIP with mac no longer
// wins it (eligible are the nodes that may answer it now) and, when a
// libvirt event took its domain down, when that event came: the start of
// the failover the announcer times.
func (p *placement) moveReason(snap snapshot, mac net.HardwareAddr, eligible []string) (string, time.Time) {
	h, ok := snap.holder(mac)
	if !ok {
		return metrics.MoveUnknown, time.Time{}
	}
	v, listed := snap.view(h.name)
	n := v.node
	if !listed || n.DeletionTimestamp != nil {
		return metrics.MoveNodeDeleted, time.Time{}
	}
	if !v.known {
		// The hypervisor says the domain is gone: it went down last pass
		// or was undefined since.
		return metrics.MoveDomainDown, h.facts.downEvent
	}
	if !p.eligible(h.name, v.facts) {
		return metrics.MoveDomainDown, v.facts.downEvent
	}
	if _, excluded := n.Labels[excludeLabel]; excluded {
		return metrics.MoveNodeExcluded, time.Time{}
	}
	if !nodeReady(n) {
		return metrics.MoveNodeNotReady, time.Time{}
	}
	if !slices.Contains(eligible, h.name) {
		return metrics.MoveEndpoints, time.Time{}
	}
	return metrics.MoveRebalance, time.Time{}
}

// answers says, for each Service holding a claimed VIP, who answers for
// each of its VIPs now (answering: VIP → MAC, the announcer's).
func answers(snap snapshot, answering map[netip.Addr]net.HardwareAddr, holders map[netip.Addr][]string) map[string][]lb.Answer {
	out := make(map[string][]lb.Answer, len(holders))
	for ip, hs := range holders {
		a := lb.Answer{VIP: ip, MAC: answering[ip]}
		if h, ok := snap.holder(a.MAC); ok {
			a.Node = h.name
		}
		for _, k := range hs {
			out[k] = append(out[k], a)
		}
	}
	return out
}

// snapshot reads every Node and its domain's facts. A Node whose
// hypervisor cannot be asked keeps its last known facts. The snapshot's
// slice and maps are the last pass's, emptied: with 1000 Nodes, new ones
// for every pass were 0.7 of the 1.9 GB the CCM allocated over
// BenchmarkCCMMemory, and reusing them saves 3-4 of its 20 CPU seconds
// there.
func (p *placement) snapshot(ctx context.Context) snapshot {
	all, err := p.nodes.List(labels.Everything())
	snap := &p.snap
	snap.reset(len(all))
	if err != nil {
		// Nothing listed: the last pass's facts tell only who had a MAC.
		for name, f := range p.known {
			snap.add(nodeView{name: name, facts: f})
		}
		return *snap
	}
	for _, n := range all {
		v := nodeView{name: n.Name, node: n}
		d, _, err := p.instances.find(ctx, n)
		switch {
		case err == nil:
			v.facts = nodeFacts{uuid: d.UUID, state: d.State, mac: macOn(d, p.bridge), fresh: true, lastDown: d.LastDown, downEvent: d.DownEventAt}
			v.known = true
		case errors.Is(err, libvirtcloud.ErrNotFound):
		default:
			snap.unavailable = true
			v.facts, v.known = p.known[n.Name]
			v.facts.fresh = false
		}
		_, excluded := n.Labels[excludeLabel]
		switch {
		case !v.known || excluded || n.DeletionTimestamp != nil:
		case nodeReady(n):
			v.role = roleCandidate
		case readyUnknown(n):
			v.role = roleUnknown
		}
		snap.add(v)
	}
	// The last pass's facts of MACs that no listed Node's facts have now.
	for name, f := range p.known {
		if k, ok := keyOf(f.mac); ok {
			if _, held := snap.byMAC[k]; !held {
				snap.add(nodeView{name: name, facts: f})
			}
		}
	}
	for name := range p.known {
		if v, listed := snap.view(name); !listed || !v.known {
			delete(p.known, name) // deleted, or the hypervisor says its domain is gone
		}
	}
	for _, v := range snap.views {
		if v.node != nil && v.known && v.facts.fresh {
			p.known[v.name] = v.facts
		}
	}
	return *snap
}

// add appends v, indexing it by name if it is a listed Node's and by MAC
// if its facts have one.
func (s *snapshot) add(v nodeView) {
	i := int32(len(s.views))
	s.views = append(s.views, v)
	if v.node != nil {
		s.byName[v.name] = i
	}
	if k, ok := keyOf(v.facts.mac); ok && (v.known || v.node == nil) {
		s.byMAC[k] = i
	}
}

// reset empties s for a pass over nodes Nodes, keeping its room.
func (s *snapshot) reset(nodes int) {
	if s.byName == nil {
		*s = snapshot{views: make([]nodeView, 0, nodes), byName: make(map[string]int32, nodes), byMAC: make(map[macKey]int32, nodes)}
		return
	}
	s.views = s.views[:0]
	clear(s.byName)
	clear(s.byMAC)
	s.unavailable = false
}

// nodeWithMAC is the candidate Node whose domain has mac on the bridge. A
// listed Node's view holds its MAC whenever its facts are known, so the
// holder's own role says it.
func (s snapshot) nodeWithMAC(mac net.HardwareAddr) string {
	if h, ok := s.holder(mac); ok && h.role == roleCandidate {
		return h.name
	}
	return ""
}

// eligible: the domain runs (a paused one counts: it resumes with its
// network as it was, and a long pause makes the Node NotReady anyway), has
// a NIC on the bridge, and the Node has reported since the domain was last
// seen down (until then its Ready is the one from before).
func (p *placement) eligible(name string, f nodeFacts) bool {
	if f.mac == nil || (f.state != libvirtcloud.StateRunning && f.state != libvirtcloud.StatePaused) {
		return false
	}
	if f.lastDown.IsZero() {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	reported := p.reportAt[name].After(f.lastDown)
	if reported {
		delete(p.awaiting, name)
	} else {
		p.awaiting[name] = true
	}
	return reported
}

// placementInputsChanged says whether a Node update changes what a pass
// reads of the Node: its readiness (status, and when it last changed, which
// starts UnknownHold), the exclusion label, its deletion, and what finds
// its domain and next hop (provider ID, system UUID, addresses).
func placementInputsChanged(old, cur *v1.Node) bool {
	ro, rc := readyCondition(old), readyCondition(cur)
	_, exOld := old.Labels[excludeLabel]
	_, exCur := cur.Labels[excludeLabel]
	return ro.Status != rc.Status || !ro.LastTransitionTime.Equal(&rc.LastTransitionTime) ||
		exOld != exCur || (old.DeletionTimestamp == nil) != (cur.DeletionTimestamp == nil) ||
		old.Spec.ProviderID != cur.Spec.ProviderID || old.Status.NodeInfo.SystemUUID != cur.Status.NodeInfo.SystemUUID ||
		!slices.Equal(old.Status.Addresses, cur.Status.Addresses)
}

func macOn(d libvirtcloud.Domain, bridge string) net.HardwareAddr {
	for _, i := range d.Interfaces {
		if i.Bridge != bridge {
			continue
		}
		if mac, err := net.ParseMAC(i.MAC); err == nil && len(mac) == len(macKey{}) {
			return mac
		}
	}
	return nil
}

// narrow applies the policies of the Services sharing a VIP: with
// externalTrafficPolicy Local, only nodes with a ready endpoint.
func (p *placement) narrow(nodes []string, holders []string, given givenServices) []string {
	out := nodes
	for _, k := range holders {
		s := p.lookupService(k, given)
		if s == nil || s.Spec.ExternalTrafficPolicy != v1.ServiceExternalTrafficPolicyLocal {
			continue
		}
		with := p.endpointNodes(s)
		var narrowed []string
		for _, n := range out {
			if with[n] {
				narrowed = append(narrowed, n)
			}
		}
		out = narrowed
	}
	return out
}

func (p *placement) lookupService(k string, given givenServices) *v1.Service {
	if s, ok := given[k]; ok {
		return s
	}
	ns, name := splitKey(k)
	s, err := p.services.Services(ns).Get(name)
	if err != nil {
		return nil
	}
	return s
}

// endpointNodes are the nodes holding a ready endpoint of svc.
func (p *placement) endpointNodes(svc *v1.Service) map[string]bool {
	out := map[string]bool{}
	slices, err := p.slices.EndpointSlices(svc.Namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: svc.Name}))
	if err != nil {
		return out
	}
	for _, s := range slices {
		readyNodes(s, out)
	}
	return out
}

// readyNodes adds the nodes holding a ready endpoint of s to into (a new
// map if nil) and returns it.
func readyNodes(s *discoveryv1.EndpointSlice, into map[string]bool) map[string]bool {
	if into == nil {
		into = map[string]bool{}
	}
	for _, ep := range s.Endpoints {
		if ep.NodeName != nil && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
			into[*ep.NodeName] = true
		}
	}
	return into
}

func (p *placement) event(holders []string, given givenServices, typ, reason, format string, args ...any) {
	for _, k := range holders {
		if s := p.lookupService(k, given); s != nil {
			p.recorder.Eventf(s, typ, reason, format, args...)
		}
	}
}

// eventOnce reports a VIP no node can answer to the Services being synced
// (the service controller's calls), not on every pass.
func (p *placement) eventOnce(holders []string, given givenServices, ip netip.Addr) {
	for _, k := range holders {
		if s, ok := given[k]; ok {
			p.recorder.Eventf(s, v1.EventTypeWarning, ReasonNoNode, "No eligible node (running domain on %s, Ready, not labelled node.kubernetes.io/exclude-from-external-load-balancers as kubeadm labels control planes, with endpoints for Local policy) can answer for %s", p.bridge, ip)
		}
	}
}

func nodeReady(n *v1.Node) bool { return readyStatus(n) == v1.ConditionTrue }

// readyUnknown: kube-controller-manager has not heard from the Node's
// kubelet within its grace period (or the kubelet never reported).
func readyUnknown(n *v1.Node) bool { return readyStatus(n) == v1.ConditionUnknown }

// readyCondition is the Node's Ready condition; an empty one without it.
func readyCondition(n *v1.Node) v1.NodeCondition {
	if _, c := nodeutil.GetNodeCondition(&n.Status, v1.NodeReady); c != nil {
		return *c
	}
	return v1.NodeCondition{}
}

// readyStatus is the status of the Node's Ready condition; "" without one.
func readyStatus(n *v1.Node) v1.ConditionStatus { return readyCondition(n).Status }

// readyHeartbeat is the Ready condition's heartbeat (the kubelet's clock).
func readyHeartbeat(n *v1.Node) time.Time { return readyCondition(n).LastHeartbeatTime.Time }

// readyChanged is when the Node's Ready condition last changed status, by
// the clock of whoever changed it (for Unknown, kube-controller-manager's).
func readyChanged(n *v1.Node) time.Time { return readyCondition(n).LastTransitionTime.Time }

// readyReport identifies the Node's last Ready report (status and
// heartbeat, compared as values, never against a clock).
func readyReport(n *v1.Node) string {
	c := readyCondition(n)
	if c.Type == "" {
		return ""
	}
	return string(c.Status) + "@" + c.LastHeartbeatTime.UTC().String()
}
