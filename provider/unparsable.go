package provider

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/labcloud/labcloud/libvirtcloud"
)

// EventDomainUnparsable: a Node's domain has a definition the provider
// cannot read, so the Node keeps what was last known of it.
const EventDomainUnparsable = "DomainUnparsable"

// unparsableSource is a hypervisor that skips domains it cannot parse;
// *libvirtcloud.Hypervisor is one.
type unparsableSource interface {
	Subscribe() (<-chan libvirtcloud.Event, func())
	Unparsable() []libvirtcloud.UnparsableDomain
}

// unparsableReporter puts a Warning on the Node of each domain a
// hypervisor skips, once per domain and reason.
type unparsableReporter struct {
	sources  []unparsableSource
	nodes    corelisters.NodeLister
	recorder record.EventRecorder
	reported map[string]string // domain UUID → the reason last reported, while unparsable; the reporter's loop only
}

func newUnparsableReporter(hvs []Hypervisor) *unparsableReporter {
	r := &unparsableReporter{reported: map[string]string{}}
	for _, h := range hvs {
		if s, ok := h.(unparsableSource); ok {
			r.sources = append(r.sources, s)
		}
	}
	return r
}

func (r *unparsableReporter) start(ctx context.Context, _ kubernetes.Interface, factory informers.SharedInformerFactory, recorder record.EventRecorder) error {
	if len(r.sources) == 0 {
		return nil
	}
	r.recorder = recorder
	informer := factory.Core().V1().Nodes()
	r.nodes = informer.Lister()
	synced := informer.Informer().HasSynced
	// A domain found unparsable, or nil: some domain changed (it may parse
	// now, or be gone). Every item received prunes the table, so a nil is
	// dropped when the channel is full: the items queued prune it too.
	found := make(chan *libvirtcloud.UnparsableDomain, 64)
	send := func(d *libvirtcloud.UnparsableDomain) bool {
		select {
		case found <- d:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for _, s := range r.sources {
		ch, stop := s.Subscribe()
		go func() {
			defer stop()
			// Domains found before the subscription, then each new one.
			for _, d := range s.Unparsable() {
				if !send(&d) {
					return
				}
			}
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-ch:
					if !ok {
						return
					}
					if ev.Unparsable != nil {
						if !send(ev.Unparsable) {
							return
						}
						continue
					}
					select {
					case found <- nil:
					default:
					}
				}
			}
		}()
	}
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), synced) {
			return
		}
		for {
			select {
			case <-ctx.Done():
				return
			case d := <-found:
				if d != nil {
					r.report(*d)
				}
				r.forget()
			}
		}
	}()
	return nil
}

// report warns on the Node whose providerID, system UUID or name is the
// domain's, unless this reason was reported for it already.
func (r *unparsableReporter) report(d libvirtcloud.UnparsableDomain) {
	if r.reported[d.UUID] == d.Reason {
		return
	}
	r.reported[d.UUID] = d.Reason
	nodes, err := r.nodes.List(labels.Everything())
	if err != nil {
		return
	}
	for _, n := range nodes {
		if n.Spec.ProviderID == ProviderID(d.UUID) || n.Status.NodeInfo.SystemUUID == d.UUID || n.Name == d.Name {
			ref := &v1.ObjectReference{Kind: "Node", Name: n.Name, UID: n.UID}
			r.recorder.Event(ref, v1.EventTypeWarning, EventDomainUnparsable,
				fmt.Sprintf("domain %s (uuid %s) on %s cannot be parsed: %s; the Node keeps what was last known of it", d.Name, d.UUID, d.Hypervisor, d.Reason))
			return
		}
	}
}

// forget drops the domains no hypervisor finds unparsable now (they parse
// again, or are gone): the table holds only the unparsable ones, and one
// that breaks again is reported again.
func (r *unparsableReporter) forget() {
	if len(r.reported) == 0 {
		return
	}
	now := map[string]bool{}
	for _, s := range r.sources {
		for _, d := range s.Unparsable() {
			now[d.UUID] = true
		}
	}
	for uuid := range r.reported {
		if !now[uuid] {
			delete(r.reported, uuid)
		}
	}
}
