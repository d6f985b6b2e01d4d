package libvirtcloud

import "net/netip"

// index holds the cached domains and the maps that find them in O(1).
// It is not safe for concurrent use; Hypervisor guards it.
type index struct {
	byUUID map[string]Domain
	byName map[string]string // name → uuid
	byMAC  map[string]string // mac → uuid
}

func newIndex() index {
	return index{byUUID: map[string]Domain{}, byName: map[string]string{}, byMAC: map[string]string{}}
}

// put adds or replaces d and returns the previous snapshot, if any.
func (x *index) put(d Domain) (Domain, bool) {
	old, had := x.remove(d.UUID)
	x.byUUID[d.UUID] = d
	x.byName[d.Name] = d.UUID
	for _, i := range d.Interfaces {
		x.byMAC[i.MAC] = d.UUID
	}
	return old, had
}

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
