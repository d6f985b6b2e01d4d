package libvirtcloud

import (
	"net/netip"
	"slices"
	"time"
)

// index holds the cached domains and the maps that find them in O(1).
// It is not safe for concurrent use; Hypervisor guards it.
type index struct {
	byUUID map[string]Domain
	byName map[string]string // name → uuid
	byMAC  map[string]string // mac → uuid
	// tapsGone are the targets (taps) seen to leave the bridge while
	// their domain ran. A definition read afresh while libvirt still
	// lists the target keeps the NIC marked (Interface.TapGoneAt).
	tapsGone map[string]goneTap
}

func newIndex() index {
	return index{byUUID: map[string]Domain{}, byName: map[string]string{}, byMAC: map[string]string{}, tapsGone: map[string]goneTap{}}
}

// put adds or replaces d and returns the previous snapshot, if any. Its
// NICs whose taps are gone are marked so.
func (x *index) put(d Domain) (Domain, bool) {
	old, had := x.remove(d.UUID)
	d = x.markTapsGone(d)
	x.byUUID[d.UUID] = d
	x.byName[d.Name] = d.UUID
	for _, i := range d.Interfaces {
		x.byMAC[i.MAC] = d.UUID
	}
	return old, had
}

// remove drops the domain; the taps it lost stay noted until put or
// forgetTaps (put after remove is how a domain is replaced).
func (x *index) remove(uuid string) (Domain, bool) {
	old, had := x.byUUID[uuid]
	if !had {
		return Domain{}, false
	}
	delete(x.byUUID, uuid)
	if x.byName[old.Name] == uuid {
		delete(x.byName, old.Name)
	}
	for _, i := range old.Interfaces {
		if x.byMAC[i.MAC] == uuid {
			delete(x.byMAC, i.MAC)
		}
	}
	return old, true
}

func (x *index) byNameLookup(name string) (Domain, bool) {
	u, ok := x.byName[name]
	if !ok {
		return Domain{}, false
	}
	d, ok := x.byUUID[u]
	return d, ok
}

// byAddress finds the domain owning ip according to the lease and agent
// address caches.
func (x *index) byAddress(ip netip.Addr, leases map[string][]netip.Addr, agent map[string]agentAnswer) (Domain, bool) {
	for mac, addrs := range leases {
		for _, a := range addrs {
			if a == ip {
				if u, ok := x.byMAC[mac]; ok {
					return x.byUUID[u], true
				}
			}
		}
	}
	for u, ans := range agent {
		for _, a := range ans.addrs {
			if a == ip {
				d, ok := x.byUUID[u]
				return d, ok
			}
		}
	}
	return Domain{}, false
}

// goneTap is a tap that left the bridge: its domain's UUID, and when.
type goneTap struct {
	uuid string
	at   time.Time
}

// markTapsGone returns d with the NICs whose taps are gone marked (a copy
// of its interfaces if any changes: a Domain is a value), and forgets the
// gone taps of d that its definition no longer names.
func (x *index) markTapsGone(d Domain) Domain {
	named, cloned := map[string]bool{}, false
	for i, ifc := range d.Interfaces {
		g, gone := x.tapsGone[ifc.Target]
		if ifc.Target == "" || !gone || g.uuid != d.UUID {
			continue
		}
		named[ifc.Target] = true
		if !ifc.TapGoneAt.Equal(g.at) {
			if !cloned {
				d.Interfaces, cloned = slices.Clone(d.Interfaces), true
			}
			d.Interfaces[i].TapGoneAt = g.at
		}
	}
	for tap, g := range x.tapsGone {
		if g.uuid == d.UUID && !named[tap] {
			delete(x.tapsGone, tap)
		}
	}
	return d
}

// tapGone notes that tap left the bridge at at and marks the running
// domain's NIC; it returns the domain if one changed.
func (x *index) tapGone(tap string, at time.Time) (Domain, bool) {
	for _, d := range x.byUUID {
		if d.State.Down() {
			continue
		}
		for _, ifc := range d.Interfaces {
			if ifc.Target == tap && ifc.TapGoneAt.IsZero() {
				x.tapsGone[tap] = goneTap{uuid: d.UUID, at: at}
				x.put(d)
				return x.byUUID[d.UUID], true
			}
		}
	}
	return Domain{}, false
}

// tapBack forgets that tap left the bridge; it returns the domain whose
// NIC it was, to be read afresh.
func (x *index) tapBack(tap string) (uuid string, ok bool) {
	g, ok := x.tapsGone[tap]
	delete(x.tapsGone, tap)
	return g.uuid, ok
}

// forgetTaps forgets the gone taps of a domain that left the cache.
func (x *index) forgetTaps(uuid string) {
	for tap, g := range x.tapsGone {
		if g.uuid == uuid {
			delete(x.tapsGone, tap)
		}
	}
}
