package libvirtcloud

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"
	"libvirt.org/go/libvirt"
)

// resync rebuilds the domain and lease caches from a listing and publishes
// the differences as events. The listing carries every domain's state in
// one call; a domain's definition is read again only when it is new, its
// state changed, or full is set (a new connection, events lost): definitions
// otherwise change with events (defined, started, device added or removed)
// that refresh them. An unchanged host costs one call, plus the leases.
func (h *Hypervisor) resync(ctx context.Context, conn *libvirt.Connect, full bool) error {
	start := time.Now()
	stats, err := conn.GetAllDomainStats(nil, libvirt.DOMAIN_STATS_STATE, 0)
	h.called("GetAllDomainStats", start)
	if err != nil {
		return fmt.Errorf("list domains on %s: %w", h.opts.URI, err)
	}
	defer func() {
		for i := range stats {
			stats[i].Domain.Free()
		}
	}()
	h.mu.RLock()
	cached, wasBad := h.domains, maps.Clone(h.bad)
	h.mu.RUnlock()
	fresh := make([]Domain, 0, len(stats))
	var bad []UnparsableDomain
	for i := range stats {
		st := stats[i]
		if st.Domain == nil || st.State == nil || !st.State.StateSet {
			continue
		}
		state := stateFromLibvirt(libvirt.DomainState(st.State.State))
		uuid, err := st.Domain.GetUUIDString() // local
		if err != nil {
			continue
		}
		uuid = strings.ToLower(uuid)
		if prev, ok := cached.byUUID[uuid]; ok && !full && prev.State == state {
			fresh = append(fresh, prev)
			continue
		}
		if prev, ok := wasBad[uuid]; ok && !full && prev.State == state {
			bad = append(bad, prev)
			continue
		}
		d, err := h.describeAs(st.Domain, state)
		if isNoDomain(err) {
			continue // undefined while we listed
		}
		var unparsable *unparsableError
		if errors.As(err, &unparsable) {
			bad = append(bad, unparsable.domain)
			continue
		}
		if err != nil {
			return err
		}
		fresh = append(fresh, d)
	}
	leases, leaseErr := h.readLeases(conn)

	h.mu.Lock()
	old, oldBad := h.domains, h.bad
	h.domains, h.bad = newIndex(), make(map[string]UnparsableDomain, len(bad))
	h.domains.tapsGone = old.tapsGone
	var news []UnparsableDomain
	for _, u := range bad {
		if prev, had := oldBad[u.UUID]; had && prev.Reason == u.Reason {
			u.Since = prev.Since
		} else {
			news = append(news, u)
		}
		h.bad[u.UUID] = u
	}
	var changed []Event
	var healed []Domain
	now := time.Now()
	for _, d := range fresh {
		prev, had := old.byUUID[d.UUID]
		d.carryOver(prev, had, now)
		h.domains.put(d)
		if !had || prev.State != d.State {
			changed = append(changed, Event{Domain: d})
		}
		if _, was := oldBad[d.UUID]; was {
			healed = append(healed, d)
		}
	}
	for u, d := range old.byUUID {
		_, still := h.domains.byUUID[u]
		_, isBad := h.bad[u]
		if !still {
			h.domains.forgetTaps(u)
		}
		if !still && !isBad {
			changed = append(changed, Event{Domain: d, Removed: true})
		}
	}
	if leaseErr == nil {
		h.leases, h.netFamilies, h.leasesAt = leases.byMAC, leases.families, time.Now()
	}
	h.agent = map[string]agentAnswer{}
	h.synced = true
	h.cached()
	h.mu.Unlock()

	log := klog.FromContext(ctx)
	if leaseErr != nil {
		log.Error(leaseErr, "Cannot read DHCP leases; keeping the previous ones", "hypervisor", h.opts.URI)
	}
	for _, e := range changed {
		h.subs.publish(e)
	}
	h.reportBad(log, news, healed)
	return nil
}

// describe reads one domain's state and definition (two libvirt calls).
func (h *Hypervisor) describe(dom *libvirt.Domain) (Domain, error) {
	start := time.Now()
	st, _, err := dom.GetState()
	h.called("GetState", start)
	if err != nil {
		return Domain{}, fmt.Errorf("domain state on %s: %w", h.opts.URI, err)
	}
	return h.describeAs(dom, stateFromLibvirt(st))
}

// describeAs reads one domain's definition (one libvirt call); its state
// is known. A definition that cannot be parsed is an *unparsableError.
func (h *Hypervisor) describeAs(dom *libvirt.Domain, state State) (Domain, error) {
	start := time.Now()
	desc, err := dom.GetXMLDesc(0)
	h.called("GetXMLDesc", start)
	if err != nil {
		return Domain{}, fmt.Errorf("domain XML on %s: %w", h.opts.URI, err)
	}
	d, err := parseDomainXML(desc)
	if err != nil {
		return Domain{}, h.unparsable(dom, state, err)
	}
	d.State = state
	d.Hypervisor = h.opts.Zone
	return d, nil
}

// apply folds one lifecycle event into the cache. The state implied by the
// event is published first, so that subscribers (VIP failover) react
// without waiting for the follow-up libvirt calls.
func (h *Hypervisor) apply(ctx context.Context, conn *libvirt.Connect, ev rawEvent) {
	if ev.event == eventTapGone || ev.event == eventTapBack {
		refresh, ok := h.applyTap(ctx, ev)
		if !ok {
			return
		}
		ev = refresh
	}
	h.mu.Lock()
	d, known := h.domains.byUUID[ev.uuid]
	delete(h.agent, ev.uuid)
	if known {
		if st, ok := stateFromEvent(ev.event, ev.detail); ok && st != d.State {
			prev := d
			d.State = st
			d.carryOver(prev, true, time.Now())
			if st.Down() && !prev.State.Down() {
				d.DownEventAt = ev.at
			}
			h.domains.put(d)
			h.mu.Unlock()
			h.subs.publish(Event{Domain: d})
			h.mu.Lock()
		}
		if ev.event == libvirt.DOMAIN_EVENT_UNDEFINED {
			h.domains.remove(ev.uuid)
			h.domains.forgetTaps(ev.uuid)
			h.cached()
			h.mu.Unlock()
			h.subs.publish(Event{Domain: d, Removed: true})
			return
		}
	}
	h.mu.Unlock()

	// Refresh the definition: it changes on define and start (bridge names),
	// and a transient domain disappears on stop without an undefine event.
	start := time.Now()
	dom, err := conn.LookupDomainByUUIDString(ev.uuid)
	h.called("LookupDomainByUUIDString", start)
	if isNoDomain(err) {
		h.mu.Lock()
		old, had := h.domains.remove(ev.uuid)
		h.domains.forgetTaps(ev.uuid)
		delete(h.bad, ev.uuid)
		h.cached()
		h.mu.Unlock()
		if had {
			h.subs.publish(Event{Domain: old, Removed: true})
		}
		return
	}
	log := klog.FromContext(ctx)
	if err != nil {
		log.Error(err, "Cannot refresh domain after event", "uuid", ev.uuid, "hypervisor", h.opts.URI)
		return
	}
	fresh, err := h.describe(dom)
	dom.Free()
	var unparsable *unparsableError
	if errors.As(err, &unparsable) {
		h.noteBad(log, unparsable.domain)
		return
	}
	if err != nil {
		log.Error(err, "Cannot refresh domain after event", "uuid", ev.uuid, "hypervisor", h.opts.URI)
		return
	}
	h.mu.Lock()
	_, wasBad := h.bad[fresh.UUID]
	delete(h.bad, fresh.UUID)
	prev, had := h.domains.byUUID[fresh.UUID]
	fresh.carryOver(prev, had, time.Now())
	if had && fresh.State.Down() && !prev.State.Down() {
		// An event that implies no state (QEMU's SHUTDOWN as its process
		// is killed) and a refresh that finds the domain down.
		fresh.DownEventAt = ev.at
	}
	h.domains.put(fresh)
	fresh = h.domains.byUUID[fresh.UUID] // as put marked its gone taps
	h.cached()
	h.mu.Unlock()
	// A definition read again after a device or a tap came back may differ
	// in its NICs alone: placement must hear of it, not wait for a pass.
	if !had || prev.State != fresh.State || !slices.Equal(prev.Interfaces, fresh.Interfaces) {
		h.subs.publish(Event{Domain: fresh})
	}
	if wasBad {
		h.reportBad(log, nil, []Domain{fresh})
	}
}

// stateFromEvent is the state a lifecycle event implies, if any.
func stateFromEvent(ev libvirt.DomainEventType, detail int) (State, bool) {
	switch ev {
	case libvirt.DOMAIN_EVENT_STARTED, libvirt.DOMAIN_EVENT_RESUMED:
		return StateRunning, true
	case libvirt.DOMAIN_EVENT_SUSPENDED, libvirt.DOMAIN_EVENT_PMSUSPENDED:
		return StatePaused, true
	case libvirt.DOMAIN_EVENT_CRASHED:
		return StateCrashed, true
	case libvirt.DOMAIN_EVENT_STOPPED:
		if libvirt.DomainEventStoppedDetailType(detail) == libvirt.DOMAIN_EVENT_STOPPED_CRASHED ||
			libvirt.DomainEventStoppedDetailType(detail) == libvirt.DOMAIN_EVENT_STOPPED_FAILED {
			return StateCrashed, true
		}
		return StateShutOff, true
	}
	return StateUnknown, false
}
