package lb

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Service status condition that says which node answers for the
// Service's VIPs, and since when (its lastTransitionTime). The provider
// writes it; `labcloud status` and users read it.
const (
	ConditionAnnounced = "lb.labcloud.io/Announced"
	// ReasonAnnounced: status True, a node answers for every VIP.
	ReasonAnnounced = "Announced"
	// ReasonNoEligibleNode: status False, no node can answer for some VIP.
	ReasonNoEligibleNode = "NoEligibleNode"
)

// Answer says who answers for one VIP: a node and its MAC; no Node but a
// MAC when the MAC belongs to no Node known; neither when nobody does.
type Answer struct {
	VIP  netip.Addr
	Node string
	MAC  net.HardwareAddr
}

// Message segments, one per VIP, joined by "; ":
//
//	10.123.0.200 answered by node lab-node-1 (52:54:00:7c:00:01)
//	10.123.0.200 answered by an unknown node (52:54:00:7c:00:01)
//	10.123.0.200 answered by no node (none is eligible: ...)
const (
	segSep      = "; "
	byNode      = "answered by node "
	byUnknown   = "answered by an unknown node "
	noNode      = "answered by no node"
	noNodeWhy   = noNode + " (none is eligible: it needs a running domain on the bridge, a Ready Node and, with externalTrafficPolicy Local, a ready endpoint)"
	macOpen     = "("
	macClose    = ")"
	maxSegments = 2 // one VIP per family
)

// AnnouncedCondition is the condition for a Service whose VIPs get these
// answers: True with ReasonAnnounced when every VIP is answered, else False
// with ReasonNoEligibleNode. The caller sets LastTransitionTime.
func AnnouncedCondition(answers []Answer) metav1.Condition {
	answers = slices.Clone(answers)
	slices.SortFunc(answers, func(a, b Answer) int { return a.VIP.Compare(b.VIP) })
	c := metav1.Condition{Type: ConditionAnnounced, Status: metav1.ConditionTrue, Reason: ReasonAnnounced}
	segs := make([]string, 0, len(answers))
	for _, a := range answers {
		switch {
		case a.MAC == nil:
			c.Status, c.Reason = metav1.ConditionFalse, ReasonNoEligibleNode
			segs = append(segs, a.VIP.String()+" "+noNodeWhy)
		case a.Node == "":
			segs = append(segs, a.VIP.String()+" "+byUnknown+macOpen+a.MAC.String()+macClose)
		default:
			segs = append(segs, a.VIP.String()+" "+byNode+a.Node+" "+macOpen+a.MAC.String()+macClose)
		}
	}
	c.Message = strings.Join(segs, segSep)
	return c
}

// SameAnnounced reports whether two Announced conditions say the same
// (status, reason and message), whatever their times.
func SameAnnounced(a, b metav1.Condition) bool {
	return a.Type == b.Type && a.Status == b.Status && a.Reason == b.Reason && a.Message == b.Message
}

// ParseAnnounced reads the answers back from an Announced condition's
// message, in VIP order. Anyone who may write a Service's status may
// write the condition, so only what AnnouncedCondition writes is read: a
// VIP of each family at most, without a zone, and each MAC a NIC's (six
// bytes, unicast, not zero).
func ParseAnnounced(c metav1.Condition) ([]Answer, error) {
	if c.Type != ConditionAnnounced {
		return nil, fmt.Errorf("condition type %q, want %q", c.Type, ConditionAnnounced)
	}
	segs := strings.Split(c.Message, segSep)
	if c.Message == "" || len(segs) > maxSegments {
		return nil, fmt.Errorf("condition message %q: want one segment per VIP", c.Message)
	}
	out := make([]Answer, 0, len(segs))
	for _, seg := range segs {
		a, err := parseSegment(seg)
		if err != nil {
			return nil, fmt.Errorf("condition message %q: %w", c.Message, err)
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b Answer) int { return a.VIP.Compare(b.VIP) })
	if len(out) == 2 && out[0].VIP.Is4() == out[1].VIP.Is4() {
		return nil, fmt.Errorf("condition message %q: two VIPs of one family", c.Message)
	}
	return out, nil
}

func parseSegment(seg string) (Answer, error) {
	first, rest, ok := strings.Cut(seg, " ")
	if !ok {
		return Answer{}, fmt.Errorf("segment %q names no VIP", seg)
	}
	ip, err := netip.ParseAddr(first)
	if err != nil {
		return Answer{}, fmt.Errorf("segment %q: %w", seg, err)
	}
	if ip.Zone() != "" || ip.Is4In6() {
		return Answer{}, fmt.Errorf("segment %q: %s is not a VIP", seg, ip)
	}
	a := Answer{VIP: ip}
	var macPart string
	switch {
	case strings.HasPrefix(rest, noNode):
		return a, nil
	case strings.HasPrefix(rest, byUnknown):
		macPart = strings.TrimPrefix(rest, byUnknown)
	case strings.HasPrefix(rest, byNode):
		name, m, ok := strings.Cut(strings.TrimPrefix(rest, byNode), " ")
		if !ok || name == "" {
			return Answer{}, fmt.Errorf("segment %q names no node", seg)
		}
		a.Node, macPart = name, m
	default:
		return Answer{}, fmt.Errorf("segment %q: unknown form", seg)
	}
	if !strings.HasPrefix(macPart, macOpen) || !strings.HasSuffix(macPart, macClose) {
		return Answer{}, fmt.Errorf("segment %q: no (MAC)", seg)
	}
	mac, err := net.ParseMAC(strings.TrimSuffix(strings.TrimPrefix(macPart, macOpen), macClose))
	if err != nil {
		return Answer{}, fmt.Errorf("segment %q: %w", seg, err)
	}
	if len(mac) != 6 || mac[0]&1 != 0 || bytes.Equal(mac, make(net.HardwareAddr, 6)) {
		return Answer{}, fmt.Errorf("segment %q: %s is not a NIC's MAC", seg, mac)
	}
	a.MAC = mac
	return a, nil
}
