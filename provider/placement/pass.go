package placement

import (
	"context"
	"maps"
	"net"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/metrics"
)

// Event reasons on Services, about one VIP each. ReasonVIPAnnounced and
// ReasonNoNodeForVIP have the values of lb.ReasonAnnounced and
// lb.ReasonNoEligibleNode, the Announced condition's reasons, about all of
// a Service's VIPs.
const (
	ReasonVIPAnnounced = "Announced"      // a VIP no node answered is answered now
	ReasonVIPMoved     = "AnnouncerMoved" // another node answers a VIP now
	ReasonNoNodeForVIP = "NoEligibleNode" // no node may answer a VIP
)

// pass places every VIP and applies the result; its caller holds the
// passing token.
func (p *Placement) pass(ctx context.Context, given givenServices) {
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
	now := time.Now()
	snap := p.snapshot(ctx, given, now)
	defer clear(snap.views) // keeps no Node the informer has replaced
	p.answers.seed(p.services, snap.vips)
	holdEnds := p.apply(ctx, snap, decide(snap, p.answers.answering(), p.dampedUntil, now), given)
	// A released VIP's damping goes with it.
	maps.DeleteFunc(p.dampedUntil, func(ip netip.Addr, _ time.Time) bool { _, claimed := snap.vips[ip]; return !claimed })
	answering := p.answers.answering() // after this pass's changes
	p.applySpread(ctx, snap, answering)
	p.conds.update(answers(snap, answering))
	p.wakeAt(earliest(holdEnds, snap.warmedAt))
}

// earliest is the earlier of two times, zero meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}

// apply makes the answers what changes say, with the events, logs and
// metrics of each, and notes when each set VIP's damping ends; it returns
// when the earliest hold that keeps a VIP from a change ends (zero if none).
func (p *Placement) apply(ctx context.Context, snap snapshot, changes []change, given givenServices) (holdEnds time.Time) {
	log := klog.FromContext(ctx)
	zoneOf := func(mac net.HardwareAddr) (string, bool) {
		v, ok := snap.withMAC(mac)
		return v.facts.zone, ok
	}
	for _, c := range changes {
		ip := c.vip
		switch c.kind {
		case keepVIP:
			if zone, ok := zoneOf(c.mac); ok {
				// repair mends a neighbour entry that failed before.
				_ = p.answers.keep(ip, c.mac, zone, c.reason == keptPlaced && len(given) > 0)
			}
			if !c.until.IsZero() && (holdEnds.IsZero() || c.until.Before(holdEnds)) {
				holdEnds = c.until
			}
		case warnVIP:
			// Said to the Services being synced (the service controller's
			// calls), not on every pass.
			p.noNodeEvent(given.only(c.services), given, ip)
		case removeVIP:
			if err := p.answers.remove(ip); err != nil {
				msg := "Cannot stop announcing VIP"
				if c.reason == removedReleased {
					msg = "Cannot stop announcing a released VIP"
				}
				log.Error(err, msg, "ip", ip)
				continue
			}
			if c.reason == noEligibleNode {
				p.noNodeEvent(c.services, given, ip)
			}
		case setVIP:
			zone, _ := zoneOf(c.mac)
			if err := p.answers.set(ip, c.mac, zone, c.cause); err != nil {
				log.Error(err, "Announcing VIP", "ip", ip, "node", c.node)
			} else {
				p.dampedUntil[ip] = time.Now().Add(p.localDamping)
			}
			if c.from == "" {
				p.event(c.services, given, v1.EventTypeNormal, ReasonVIPAnnounced, "%s announced via node %s (%s)", ip, c.node, c.mac)
				continue
			}
			metrics.VIPMoves.WithLabelValues(c.reason).Inc()
			log.Info("VIP moved", "ip", ip, "from", c.from, "to", c.node, "mac", c.mac, "reason", c.reason)
			p.event(c.services, given, v1.EventTypeNormal, ReasonVIPMoved, "%s moved from node %s to node %s (%s)", ip, c.from, c.node, c.mac)
		}
	}
	return holdEnds
}

// wakeAt pokes a pass at t (none if t is zero), replacing the last pass's.
func (p *Placement) wakeAt(t time.Time) {
	if p.holdTimer != nil {
		p.holdTimer.Stop()
	}
	if !t.IsZero() {
		p.holdTimer = time.AfterFunc(time.Until(t), p.poke)
	}
}

// event records an event on each of services that can be found (the
// call's copy, else the cache's).
func (p *Placement) event(services []string, given givenServices, typ, reason, format string, args ...any) {
	for _, k := range services {
		if s := p.lookupService(k, given); s != nil {
			p.recorder.Eventf(s, typ, reason, format, args...)
		}
	}
}

// only is those of services that are given.
func (given givenServices) only(services []string) []string {
	var out []string
	for _, k := range services {
		if _, ok := given[k]; ok {
			out = append(out, k)
		}
	}
	return out
}

// noNodeEvent says to services that no node can answer ip.
func (p *Placement) noNodeEvent(services []string, given givenServices, ip netip.Addr) {
	p.event(services, given, v1.EventTypeWarning, ReasonNoNodeForVIP, "No eligible node (running domain on %s, Ready, not labelled node.kubernetes.io/exclude-from-external-load-balancers as kubeadm labels control planes, with endpoints for Local policy) can answer for %s", p.bridge, ip)
}

// answers says, for each Service holding a claimed VIP, who answers for
// each of its VIPs now (answering: VIP → MAC, the announcer's).
func answers(snap snapshot, answering map[netip.Addr]net.HardwareAddr) map[string][]lb.Answer {
	out := make(map[string][]lb.Answer, len(snap.vips))
	for ip, claim := range snap.vips {
		a := lb.Answer{VIP: ip, MAC: answering[ip]}
		if v, ok := snap.withMAC(a.MAC); ok {
			a.Node = v.name
		}
		for _, k := range claim.services {
			out[k] = append(out[k], a)
		}
	}
	return out
}
