package lbtest

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/labcloud/labcloud/libvirtcloud"
)

// Zone is the Hypervisor's zone.
const Zone = "zone-a"

// Hypervisor serves domains the test starts and stops, and publishes
// their changes as domain events.
type Hypervisor struct {
	mu   sync.Mutex
	doms map[string]libvirtcloud.Domain // by UUID
	subs []chan libvirtcloud.Event
	down bool // the daemon cannot be asked
}

// NewHypervisor runs a domain for each of nodes, in Zone, with a NIC on
// Bridge and one on another bridge.
func NewHypervisor(nodes []Node) *Hypervisor {
	h := &Hypervisor{doms: map[string]libvirtcloud.Domain{}}
	for _, n := range nodes {
		h.doms[n.UUID] = libvirtcloud.Domain{UUID: n.UUID, Name: n.Name, Hypervisor: Zone, State: libvirtcloud.StateRunning,
			Interfaces: []libvirtcloud.Interface{
				{MAC: "52:54:00:99:99:99", Network: "other", Bridge: "virbr9"}, // not on the bridge: never announced
				{MAC: n.MAC.String(), Network: "lab", Bridge: Bridge},
			}}
	}
	return h
}

// Connected says whether the daemon can be asked.
func (h *Hypervisor) Connected() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.down
}

// SetDown makes the daemon unreachable (true) or reachable again.
func (h *Hypervisor) SetDown(down bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.down = down
}

func (h *Hypervisor) Zone() string { return Zone }

func (h *Hypervisor) DomainByUUID(uuid string) (libvirtcloud.Domain, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down {
		return libvirtcloud.Domain{}, fmt.Errorf("uuid %s: %w", uuid, libvirtcloud.ErrUnavailable)
	}
	if d, ok := h.doms[uuid]; ok {
		return d, nil
	}
	return libvirtcloud.Domain{}, fmt.Errorf("uuid %s: %w", uuid, libvirtcloud.ErrNotFound)
}

func (h *Hypervisor) DomainByName(name string) (libvirtcloud.Domain, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down {
		return libvirtcloud.Domain{}, fmt.Errorf("name %s: %w", name, libvirtcloud.ErrUnavailable)
	}
	for _, d := range h.doms {
		if d.Name == name {
			return d, nil
		}
	}
	return libvirtcloud.Domain{}, fmt.Errorf("name %s: %w", name, libvirtcloud.ErrNotFound)
}

func (h *Hypervisor) DomainByAddress(_ context.Context, ip netip.Addr) (libvirtcloud.Domain, error) {
	return libvirtcloud.Domain{}, fmt.Errorf("address %s: %w", ip, libvirtcloud.ErrNotFound)
}

func (h *Hypervisor) Addresses(context.Context, libvirtcloud.Domain) ([]netip.Addr, error) {
	return nil, nil
}

func (h *Hypervisor) Subscribe() (<-chan libvirtcloud.Event, func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := make(chan libvirtcloud.Event, 16)
	h.subs = append(h.subs, ch)
	return ch, func() {}
}

// SetState changes a domain's state and publishes the event, as the
// libvirt cache does on a lifecycle event.
func (h *Hypervisor) SetState(name string, st libvirtcloud.State) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for u, d := range h.doms {
		if d.Name == name {
			// As the cache does: LastDown is when it was seen going
			// down; DownEventAt, when an event took it down, until it runs.
			switch {
			case st.Down() && !d.State.Down():
				d.LastDown, d.DownEventAt = time.Now(), time.Now()
			case !st.Down():
				d.DownEventAt = time.Time{}
			}
			d.State = st
			h.doms[u] = d
			for _, ch := range h.subs {
				ch <- libvirtcloud.Event{Domain: d}
			}
		}
	}
}

// Undefine removes a domain and publishes the event, as the libvirt cache
// does when a domain is undefined.
func (h *Hypervisor) Undefine(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for u, d := range h.doms {
		if d.Name == name {
			delete(h.doms, u)
			for _, ch := range h.subs {
				ch <- libvirtcloud.Event{Domain: d}
			}
		}
	}
}

// Domain returns the named domain as the fake holds it now.
func (h *Hypervisor) Domain(name string) libvirtcloud.Domain {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, d := range h.doms {
		if d.Name == name {
			return d
		}
	}
	return libvirtcloud.Domain{}
}

// Put replaces the domain of d's UUID with d, publishing nothing.
func (h *Hypervisor) Put(d libvirtcloud.Domain) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.doms[d.UUID] = d
}

// Domains is every domain, in no order.
func (h *Hypervisor) Domains() []libvirtcloud.Domain {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Collect(maps.Values(h.doms))
}

// ZoneHost is a Hypervisor's domains in one zone: one host's hypervisor,
// as a following replica sees its own.
type ZoneHost struct {
	h    *Hypervisor
	zone string
}

// InZone is h's domains in zone.
func (h *Hypervisor) InZone(zone string) ZoneHost { return ZoneHost{h: h, zone: zone} }

func (z ZoneHost) Subscribe() (<-chan libvirtcloud.Event, func()) { return z.h.Subscribe() }
func (z ZoneHost) WaitSynced(context.Context) error               { return nil }
func (z ZoneHost) Domains() []libvirtcloud.Domain {
	var out []libvirtcloud.Domain
	for _, d := range z.h.Domains() {
		if d.Hypervisor == z.zone {
			out = append(out, d)
		}
	}
	return out
}
