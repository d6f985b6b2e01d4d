package libvirtcloud

import (
	"context"
	"time"

	"k8s.io/klog/v2"
	"libvirt.org/go/libvirt"
)

// A guest's NIC reaches the host's bridge through a tap. When QEMU dies the
// kernel deletes the tap at once, while libvirt reports the domain stopped
// only after its own clean-up (tens to hundreds of milliseconds later). A
// tap that is deleted or leaves its bridge is therefore the first sign that
// the NIC carries no traffic, and the only one a hot-unplug gives the host.
// Nothing else takes a running domain's tap away: a libvirtd restart keeps
// it (QEMU holds it open), a migration removes it only once the domain runs
// elsewhere. The NIC is marked (TapGoneAt), not forgotten: its MAC still
// names its addresses; only the traffic is gone.

// Tap events, beside libvirt's lifecycle events (all positive).
const (
	eventTapGone libvirt.DomainEventType = -2 // rawEvent.tap left the host's bridge
	eventTapBack libvirt.DomainEventType = -3 // rawEvent.tap is on a bridge again
)

// TapGone tells the cache that the host device dev was deleted or left its
// bridge at at: the running domain's NIC with that target is marked
// (TapGoneAt) and the change published at once, before libvirt says
// anything.
// Only a hypervisor on this host may be told of this host's devices.
func (h *Hypervisor) TapGone(dev string, at time.Time) {
	h.queueTap(rawEvent{tap: dev, event: eventTapGone, at: at})
}

// TapBack tells the cache that the host device dev is on a bridge again: a
// domain whose NIC was marked for it is read afresh.
func (h *Hypervisor) TapBack(dev string) {
	h.queueTap(rawEvent{tap: dev, event: eventTapBack, at: time.Now()})
}

// queueTap hands a tap event to the cache loop; if the loop is far behind
// it is dropped, as libvirt's own event follows.
func (h *Hypervisor) queueTap(ev rawEvent) {
	select {
	case h.raw <- ev:
	default:
	}
}

// applyTap folds a tap event into the cache. A tap back on a bridge
// becomes a refresh of its domain (the returned event, ok); a gone tap is
// published at once.
func (h *Hypervisor) applyTap(ctx context.Context, ev rawEvent) (refresh rawEvent, ok bool) {
	h.mu.Lock()
	if ev.event == eventTapBack {
		uuid, back := h.domains.tapBack(ev.tap)
		h.mu.Unlock()
		return rawEvent{uuid: uuid, event: eventDeviceChanged, at: ev.at}, back
	}
	d, changed := h.domains.tapGone(ev.tap, ev.at)
	h.mu.Unlock()
	if changed {
		klog.FromContext(ctx).Info("A domain's tap left the bridge: its NIC carries no traffic",
			"domain", d.Name, "tap", ev.tap, "hypervisor", h.opts.URI, "after", time.Since(ev.at))
		h.subs.publish(Event{Domain: d})
	}
	return rawEvent{}, false
}
