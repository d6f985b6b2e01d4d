package announce

import (
	"errors"
	"fmt"
	"net/netip"
)

// joinedGroups is what the bridge's current incarnation was asked to do
// for the owned IPv6 VIPs: the solicited-node groups joined, and whether
// it hands up frames for other MACs.
type joinedGroups struct {
	groups  map[netip.Addr]bool
	promisc bool
}

// solicitedNode is the group a solicitation for vip is sent to
// (ff02::1:ffXX:XXXX, RFC 4291 §2.7.1).
func solicitedNode(vip netip.Addr) netip.Addr {
	b := vip.As16()
	return netip.AddrFrom16([16]byte{0xff, 0x02, 10: 0, 11: 1, 12: 0xff, 13: b[13], 14: b[14], 15: b[15]})
}

// solicitedNodeMAC is the Ethernet group of solicitedNode(vip).
func solicitedNodeMAC(vip netip.Addr) [6]byte {
	b := vip.As16()
	return [6]byte{0x33, 0x33, 0xff, b[13], b[14], b[15]}
}

// syncGroups brings the incarnation's groups and promiscuity in line with
// the owned IPv6 VIPs: none of it costs the bridge anything while no IPv6
// VIP is owned. Callers hold changeMu.
func (a *Announcer) syncGroups() error {
	want := map[netip.Addr]bool{}
	for vip := range a.table() {
		if vip.Is6() {
			want[solicitedNode(vip)] = true
		}
	}
	b := a.bridge.Load()
	var errs []error
	if promisc := len(want) > 0; promisc != a.joined.promisc {
		if err := b.ND.SetPromiscuous(promisc); err != nil {
			errs = append(errs, fmt.Errorf("setting %s promiscuous=%v: %w", a.name, promisc, err))
		} else {
			a.joined.promisc = promisc
		}
	}
	if b.Groups == nil {
		return errors.Join(errs...)
	}
	if a.joined.groups == nil {
		a.joined.groups = map[netip.Addr]bool{}
	}
	for g := range a.joined.groups {
		if !want[g] {
			if err := b.Groups.Leave(g); err != nil {
				errs = append(errs, fmt.Errorf("leaving %s on %s: %w", g, a.name, err))
			}
			delete(a.joined.groups, g)
		}
	}
	for g := range want {
		if a.joined.groups[g] {
			continue
		}
		if err := b.Groups.Join(g); err != nil {
			errs = append(errs, fmt.Errorf("joining %s on %s: %w", g, a.name, err))
			continue
		}
		a.joined.groups[g] = true
	}
	return errors.Join(errs...)
}
