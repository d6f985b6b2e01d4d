package placement

import (
	"context"
	"errors"
	"maps"
	"net"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
)

// nodeFacts is what placement knows of one Node's domain.
type nodeFacts struct {
	uuid  string
	zone  string // of the hypervisor holding the domain
	state libvirtcloud.State
	mac   net.HardwareAddr // the domain's NIC on its hypervisor's bridge; nil if none
	fresh bool             // from a hypervisor that answered in this pass
	// lastDown is when the domain cache saw the domain go down (host
	// clock). The cache runs from process start, so it also covers what
	// happened while this replica waited for the leader lease.
	lastDown time.Time
	// downEvent is when a libvirt event took the domain down, or its
	// NIC's tap left the bridge (downEvent()); zero if it
	// runs or went down unseen by an event.
	downEvent time.Time
}

// snapshot is one pass's view of the world: every Node with its domain's
// facts, role and eligibility, and every claimed VIP with what its Services
// allow and its ranking. Each Node's view is kept once, in views, and the
// maps hold indexes into it: a large cluster's views stay in memory once,
// not once per map, between passes and in every pass of a burst.
type snapshot struct {
	unavailable bool // some hypervisor could not be asked
	// views are the Nodes listed now, then the last pass's facts of
	// domains whose MAC no listed Node's facts have now (a Node deleted,
	// a domain gone): what tells why a VIP left a node.
	views  []nodeView
	byName map[string]int32 // listed Nodes
	byMAC  map[macKey]int32 // by MAC: this pass's facts, else the last pass's
	// eligible are the candidates whose domain is eligible, in listing
	// order: the nodes that may answer a VIP its Services' policies allow.
	eligible []string
	vips     map[netip.Addr]vipClaim // the claimed VIPs
	// ranked is each claimed VIP's best nodes among those that may answer
	// it, at most maxSpreadPaths, best first: the first answers it, the
	// spread route goes via all. VIPs no node may answer are left out.
	ranked map[netip.Addr][]string
	// warmedAt is when the next node waiting out LocalEndpointWarmup may
	// serve a VIP; zero if none waits.
	warmedAt time.Time
}

// nodeView is what a pass knows of one Node.
type nodeView struct {
	name  string
	node  *v1.Node  // nil in a view of the last pass's facts
	facts nodeFacts // if known
	known bool      // its domain's facts are known now (kept if its hypervisor cannot be asked)
	role  nodeRole
	// domainEligible (listed Nodes with known facts): the domain runs (a
	// paused one counts: it resumes with its network as it was, and a long
	// pause makes the Node NotReady anyway), has a NIC on the bridge, and
	// the Node has reported since the domain was last seen down (until
	// then its Ready is the one from before).
	domainEligible bool
	// lost (listed Nodes whose hypervisor cannot be asked): its guest has
	// not answered on the bridge for lostAfterMisses probe rounds, so it
	// is taken for gone with its host.
	lost bool
}

// nodeRole is what a listed Node with known facts may do, by its Node.
type nodeRole uint8

const (
	roleNone      nodeRole = iota
	roleCandidate          // Ready, not excluded, not being deleted: answers if its domain is eligible
	roleUnknown            // Ready is Unknown, not excluded, not being deleted
)

// roleOf is the role of Node n, whose domain's facts are known or not.
func roleOf(n *v1.Node, known bool) nodeRole {
	_, excluded := n.Labels[excludeLabel]
	switch {
	case !known || excluded || n.DeletionTimestamp != nil:
		return roleNone
	case nodeReady(n):
		return roleCandidate
	case readyUnknown(n):
		return roleUnknown
	}
	return roleNone
}

// vipClaim is one claimed VIP as its Services see it.
type vipClaim struct {
	services []string // keys of the Services holding it
	// onlyOn is nil, or the nodes with a ready endpoint of each of its
	// Services with externalTrafficPolicy Local, past its warm-up: the
	// only ones that may answer it.
	onlyOn   map[string]bool
	affinity bool // a Service on it wants ClientIP session affinity
	// rankAs is the VIP it ranks as, to be answered by the same node (a
	// dual-stack Service's IPv4 VIP, lb.RankKeys); zero: itself.
	rankAs netip.Addr
}

// allows says whether the VIP's Services let node answer it.
func (c vipClaim) allows(node string) bool { return c.onlyOn == nil || c.onlyOn[node] }

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

// named is the view of the listed Node name.
func (s snapshot) named(name string) (nodeView, bool) {
	i, ok := s.byName[name]
	if !ok {
		return nodeView{}, false
	}
	return s.views[i], true
}

// withMAC is the view whose facts have mac: this pass's, else the last's.
func (s snapshot) withMAC(mac net.HardwareAddr) (nodeView, bool) {
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

// reset empties s for a pass over nodes Nodes, keeping its room.
func (s *snapshot) reset(nodes int) {
	if s.byName == nil {
		*s = snapshot{views: make([]nodeView, 0, nodes), byName: make(map[string]int32, nodes), byMAC: make(map[macKey]int32, nodes)}
		return
	}
	s.views = s.views[:0]
	s.eligible = s.eligible[:0]
	clear(s.byName)
	clear(s.byMAC)
	s.unavailable = false
	s.vips, s.ranked = nil, nil
	s.warmedAt = time.Time{}
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

// judge decides, once per pass, which listed Nodes' domains are eligible
// (reportAt: when each Node's Ready report last changed) and which
// candidates wait only for a report, added to awaiting.
func (s *snapshot) judge(reportAt map[string]time.Time, awaiting map[string]bool) {
	for i := range s.views {
		v := &s.views[i]
		if v.node == nil || !v.known {
			continue
		}
		f := v.facts
		runs := !v.lost && f.mac != nil && (f.state == libvirtcloud.StateRunning || f.state == libvirtcloud.StatePaused)
		v.domainEligible = runs && (f.lastDown.IsZero() || reportAt[v.name].After(f.lastDown))
		switch {
		case v.role != roleCandidate:
		case v.domainEligible:
			s.eligible = append(s.eligible, v.name)
		case runs:
			awaiting[v.name] = true
		}
	}
}

// rank ranks every claimed VIP's eligible nodes that its Services allow; a
// dual-stack Service's VIPs rank together.
func (s *snapshot) rank() {
	allowed := make(map[netip.Addr][]string, len(s.vips))
	var together map[netip.Addr]netip.Addr
	for ip, c := range s.vips {
		if c.rankAs.IsValid() {
			if together == nil {
				together = map[netip.Addr]netip.Addr{}
			}
			together[ip] = c.rankAs
		}
		allowed[ip] = s.eligible
		if c.onlyOn != nil {
			allowed[ip] = nil
			for _, n := range s.eligible {
				if c.onlyOn[n] {
					allowed[ip] = append(allowed[ip], n)
				}
			}
		}
	}
	s.ranked = lb.PlaceTogether(allowed, together, maxSpreadPaths)
}

// snapshot reads every Node, its domain's facts and the claimed VIPs, and
// judges and ranks them. A Node whose hypervisor cannot be asked keeps its
// last known facts. The snapshot's slices and maps are the last pass's,
// emptied: new ones for every pass were much of what the CCM allocates in
// a large cluster.
func (p *Placement) snapshot(ctx context.Context, given givenServices, now time.Time) snapshot {
	snap := &p.snap
	if p.readNodes(ctx, snap) {
		p.mu.Lock()
		clear(p.awaiting)
		snap.judge(p.reportAt, p.awaiting)
		p.mu.Unlock()
	}
	snap.vips, snap.warmedAt = p.claims(given, now)
	snap.rank()
	return *snap
}

// readNodes fills snap with every Node and its domain's facts, and keeps
// the facts in known; false if the Nodes could not be listed.
func (p *Placement) readNodes(ctx context.Context, snap *snapshot) bool {
	all, err := p.nodes.List(labels.Everything())
	snap.reset(len(all))
	if err != nil {
		// Nothing listed: the last pass's facts tell only who had a MAC.
		for name, f := range p.known {
			snap.add(nodeView{name: name, facts: f})
		}
		return false
	}
	var unasked map[netip.Addr]net.HardwareAddr // guests to probe: their hypervisor cannot be asked
	for _, n := range all {
		v := nodeView{name: n.Name, node: n}
		d, err := p.domain(ctx, n)
		switch {
		case err == nil:
			bridge := p.bridgeOf(d.Hypervisor)
			v.facts = nodeFacts{uuid: d.UUID, zone: d.Hypervisor, state: d.State, mac: macOn(d, bridge), fresh: true, lastDown: d.LastDown, downEvent: downEvent(d, bridge)}
			v.known = true
		case errors.Is(err, libvirtcloud.ErrNotFound):
		default:
			snap.unavailable = true
			v.facts, v.known = p.known[n.Name]
			v.facts.fresh = false
			if ip, ok := probeAddress(n); ok && v.known && v.facts.mac != nil {
				if unasked == nil {
					unasked = map[netip.Addr]net.HardwareAddr{}
				}
				unasked[ip] = v.facts.mac
				v.lost = p.live.lost(ip)
			}
		}
		v.role = roleOf(n, v.known)
		snap.add(v)
	}
	p.live.watch(unasked)
	// The last pass's facts of MACs that no listed Node's facts have now.
	for name, f := range p.known {
		if k, ok := keyOf(f.mac); ok {
			if _, indexed := snap.byMAC[k]; !indexed {
				snap.add(nodeView{name: name, facts: f})
			}
		}
	}
	for name := range p.known {
		if v, listed := snap.named(name); !listed || !v.known {
			delete(p.known, name) // deleted, or the hypervisor says its domain is gone
		}
	}
	for _, v := range snap.views {
		if v.node != nil && v.known && v.facts.fresh {
			p.known[v.name] = v.facts
		}
	}
	return true
}

// bridgeOf is the bridge the guests of the hypervisor of zone use: a
// node's MAC is looked for there, as bridges on several hosts may be
// named apart.
func (p *Placement) bridgeOf(zone string) string {
	if b := p.bridges[zone]; b != "" {
		return b
	}
	return p.bridge
}

// downEvent is the first sign that d stopped carrying traffic on bridge:
// libvirt's event that took it down, else its NIC's tap leaving the
// bridge; zero if neither.
func downEvent(d libvirtcloud.Domain, bridge string) time.Time {
	if !d.DownEventAt.IsZero() {
		return d.DownEventAt
	}
	for _, i := range d.Interfaces {
		if i.Bridge == bridge && !i.TapGoneAt.IsZero() {
			return i.TapGoneAt
		}
	}
	return time.Time{}
}

// macOn is the MAC of d's NIC on bridge, unless that NIC's tap is gone.
func macOn(d libvirtcloud.Domain, bridge string) net.HardwareAddr {
	for _, i := range d.Interfaces {
		if i.Bridge != bridge || !i.TapGoneAt.IsZero() {
			continue
		}
		if mac, err := net.ParseMAC(i.MAC); err == nil && len(mac) == len(macKey{}) {
			return mac
		}
	}
	return nil
}

// claims reads the claimed VIPs and their Services' policies at now, and
// says when the next endpoint's warm-up ends (zero if none waits).
func (p *Placement) claims(given givenServices, now time.Time) (map[netip.Addr]vipClaim, time.Time) {
	vips := p.alloc.VIPs()
	rankAs := lb.RankKeys(vips)
	out := make(map[netip.Addr]vipClaim, len(vips))
	serving := map[string]map[string]bool{} // each Local-policy Service's serving nodes, once per pass
	var warmedAt time.Time
	for _, v := range vips {
		if !v.Claimed {
			continue
		}
		c := vipClaim{services: v.Holders, rankAs: rankAs[v.IP]}
		for _, k := range v.Holders {
			s := p.lookupService(k, given)
			if s == nil {
				continue
			}
			c.affinity = c.affinity || s.Spec.SessionAffinity == v1.ServiceAffinityClientIP
			if s.Spec.ExternalTrafficPolicy != v1.ServiceExternalTrafficPolicyLocal {
				continue
			}
			with, seen := serving[k] // a dual-stack Service holds two VIPs
			if !seen {
				var next time.Time
				with, next = p.endpointAges.serving(k, p.endpointNodes(s), now, p.localWarmup)
				warmedAt = earliest(warmedAt, next)
				serving[k] = with
			}
			if c.onlyOn == nil {
				c.onlyOn = maps.Clone(with) // narrowed below by other Services on the VIP
				continue
			}
			maps.DeleteFunc(c.onlyOn, func(n string, _ bool) bool { return !with[n] })
		}
		out[v.IP] = c
	}
	p.endpointAges.keepOnly(serving)
	return out, warmedAt
}

// lookupService is the Service with key k: the call's copy, else the cache's.
func (p *Placement) lookupService(k string, given givenServices) *v1.Service {
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
func (p *Placement) endpointNodes(svc *v1.Service) map[string]bool {
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
