package placement

import (
	"bytes"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/labcloud/labcloud/metrics"
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

// LocalPolicyDamping is how long a VIP with a Service of
// externalTrafficPolicy Local stays on the node it was last set on while
// that node lives, whatever the endpoints do: a tenant may flip its own
// EndpointSlices at any rate, and each move costs gratuitous ARP on the
// whole bridge, a route and a status write. A node that is gone gives the
// VIP up at once; the price is a VIP left this long on a node whose
// endpoint just left, when the last move was this recent.
const LocalPolicyDamping = 10 * time.Second

// changeKind is what a pass does to one VIP.
type changeKind string

const (
	keepVIP   changeKind = "keep"   // leave it as it is
	setVIP    changeKind = "set"    // make a node answer it: a first announcement or a move
	removeVIP changeKind = "remove" // stop answering it
	warnVIP   changeKind = "warn"   // leave it unanswered, and say that no node can answer it
)

// Why a VIP is kept, removed or left unanswered. A move's reason is its
// metrics.Move* label; a first announcement has none.
const (
	keptPlaced      = "placed"         // the node it ranks first answers it already
	keptUnavailable = "unavailable"    // a hypervisor cannot be asked, and its node's state is not known now
	keptUnknown     = "unknownHold"    // its node's Ready is Unknown (UnknownHold)
	keptDamped      = "damped"         // a Local-policy VIP set on its live node too recently (LocalPolicyDamping)
	removedReleased = "released"       // no Service holds it any more
	noEligibleNode  = "noEligibleNode" // no node may answer it
)

// change is what a pass does to one VIP, and why.
type change struct {
	kind     changeKind
	vip      netip.Addr
	services []string // keys of the Services holding it; nil once released
	reason   string
	// node and mac answer the VIP after the change (set, keep); node is ""
	// when no Node's facts have a kept VIP's MAC.
	node string
	mac  net.HardwareAddr
	// from is who answered before a set: the node, or its MAC when no Node
	// has it; "" for a first announcement.
	from string
	// cause is when a libvirt event took from's domain down: the start of
	// the failover the announcer times. Zero if none did.
	cause time.Time
	// until is when the hold on a kept VIP ends, if it keeps the VIP from
	// a change (UnknownHold: from a Ready node; LocalPolicyDamping); zero
	// otherwise.
	until time.Time
}

// decide says what a pass does to every VIP the snapshot claims or the
// announcer answers (answering: VIP → MAC, now), at time now. dampedUntil
// is when each VIP's LocalPolicyDamping ends: the time of its last set
// plus the damping. It reads nothing but its arguments. Released VIPs come
// first, then the claimed ones, each in VIP order.
func decide(snap snapshot, answering map[netip.Addr]net.HardwareAddr, dampedUntil map[netip.Addr]time.Time, now time.Time) []change {
	out := make([]change, 0, len(snap.vips))
	for ip := range answering {
		if _, claimed := snap.vips[ip]; !claimed {
			out = append(out, change{kind: removeVIP, vip: ip, reason: removedReleased})
		}
	}
	released := len(out)
	for ip, claim := range snap.vips {
		out = append(out, decideVIP(snap, ip, claim, answering[ip], dampedUntil[ip], now))
	}
	byVIP := func(a, b change) int { return a.vip.Compare(b.vip) }
	slices.SortFunc(out[:released], byVIP)
	slices.SortFunc(out[released:], byVIP)
	return out
}

// decideVIP decides for one claimed VIP, answered by answeredBy (nil if
// nothing answers it), whose damping ends at dampedUntil.
func decideVIP(snap snapshot, ip netip.Addr, claim vipClaim, answeredBy net.HardwareAddr, dampedUntil time.Time, now time.Time) change {
	c := change{vip: ip, services: claim.services}
	current, found := snap.withMAC(answeredBy)
	var to string
	if r := snap.ranked[ip]; len(r) > 0 {
		to = r[0]
	}
	if answeredBy != nil {
		kept := func(reason string) change {
			c.kind, c.reason, c.mac = keepVIP, reason, answeredBy
			if found {
				c.node = current.name
			}
			return c
		}
		// While a hypervisor cannot be asked, a VIP answered by a node
		// whose state is not known now stays where it is, unless its
		// guest stopped answering on the bridge.
		if snap.unavailable && !(found && current.role == roleCandidate && current.facts.fresh) && !(found && current.lost) {
			return kept(keptUnavailable)
		}
		if until, ok := heldOnUnknown(current, found, claim); ok && (to == "" || now.Before(until)) {
			if to != "" {
				c.until = until
			}
			return kept(keptUnknown)
		}
		if to != current.name && now.Before(dampedUntil) && damps(current, found, claim) {
			c.until = dampedUntil
			return kept(keptDamped)
		}
	}
	if to == "" {
		c.kind, c.reason = warnVIP, noEligibleNode
		if answeredBy != nil {
			c.kind = removeVIP
		}
		return c
	}
	target, _ := snap.named(to)
	c.node, c.mac = to, target.facts.mac
	if bytes.Equal(answeredBy, c.mac) {
		c.kind, c.reason = keepVIP, keptPlaced
		return c
	}
	c.kind = setVIP
	if answeredBy != nil {
		c.reason, c.cause = moveReason(snap, current, found, claim)
		c.from = answeredBy.String()
		if found {
			c.from = current.name
		}
	}
	return c
}

// heldOnUnknown says whether the VIP answered by current's MAC may stay
// with it while its Node is Unknown, and until when it keeps the VIP from a
// Ready node (its Ready's transition plus UnknownHold); when no node is
// eligible it keeps it for as long as that holds. It may stay if the Node
// is Unknown (kube-controller-manager stopped hearing from the kubelet),
// not reported NotReady, its domain eligible by this pass's facts, and the
// Services' policies allow it: withdrawing or moving every VIP after a
// control-plane outage would turn a blip into a data-plane outage.
func heldOnUnknown(current nodeView, found bool, claim vipClaim) (time.Time, bool) {
	if !found || current.role != roleUnknown || !current.facts.fresh || !current.domainEligible || !claim.allows(current.name) {
		return time.Time{}, false
	}
	return readyChanged(current.node).Add(UnknownHold), true
}

// damps says whether current, the node answering a VIP, keeps it through
// LocalPolicyDamping: a Service on the VIP has externalTrafficPolicy Local
// and current is alive (a Ready candidate whose domain is eligible), so
// only endpoints or the ranking can take the VIP from it, both of which a
// tenant can flip at will.
func damps(current nodeView, found bool, claim vipClaim) bool {
	return found && claim.onlyOn != nil && current.node != nil && current.role == roleCandidate && current.domainEligible
}

// moveReason tells why current, the node answering for a VIP, no longer
// wins it and, when a libvirt event took its domain down, when that event
// came.
func moveReason(snap snapshot, current nodeView, found bool, claim vipClaim) (string, time.Time) {
	if !found {
		return metrics.MoveUnknown, time.Time{}
	}
	v, listed := snap.named(current.name)
	n := v.node
	if !listed || n.DeletionTimestamp != nil {
		return metrics.MoveNodeDeleted, time.Time{}
	}
	if !v.known {
		// The hypervisor says the domain is gone: it went down last pass
		// or was undefined since.
		return metrics.MoveDomainDown, current.facts.downEvent
	}
	if v.lost {
		return metrics.MoveHostLost, time.Time{}
	}
	if !v.domainEligible {
		return metrics.MoveDomainDown, v.facts.downEvent
	}
	if _, excluded := n.Labels[excludeLabel]; excluded {
		return metrics.MoveNodeExcluded, time.Time{}
	}
	if !nodeReady(n) {
		return metrics.MoveNodeNotReady, time.Time{}
	}
	// A Ready, eligible node: only its Services' policies or the ranking
	// can have taken the VIP from it.
	if !claim.allows(current.name) {
		return metrics.MoveEndpoints, time.Time{}
	}
	return metrics.MoveRebalance, time.Time{}
}
