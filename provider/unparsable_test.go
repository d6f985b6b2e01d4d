package provider

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/labcloud/labcloud/libvirtcloud"
)

// skippingHypervisor is a Hypervisor that skipped some domains before it
// was subscribed to, and reports more on its channel.
type skippingHypervisor struct {
	Hypervisor
	events chan libvirtcloud.Event

	mu     sync.Mutex
	before []libvirtcloud.UnparsableDomain // what Unparsable says now
	asked  int                             // calls of Unparsable
}

func (h *skippingHypervisor) Subscribe() (<-chan libvirtcloud.Event, func()) {
	return h.events, func() {}
}

func (h *skippingHypervisor) Unparsable() []libvirtcloud.UnparsableDomain {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.asked++
	return slices.Clone(h.before)
}

// now makes ds the domains the hypervisor cannot parse, and returns how
// often Unparsable was called so far.
func (h *skippingHypervisor) now(ds ...libvirtcloud.UnparsableDomain) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.before = ds
	return h.asked
}

// askedAfter waits until Unparsable was called more than n times.
func (h *skippingHypervisor) askedAfter(n int) bool {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if h.now(h.before...) > n {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// TestUnparsableDomainWarnsOnItsNode: a Warning on the Node whose domain
// was skipped (matched by providerID, then by name), once per reason; none
// for a domain no Node has.
func TestUnparsableDomainWarnsOnItsNode(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	byID := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Spec: v1.NodeSpec{ProviderID: ProviderID("aaaa")}}
	byName := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}
	client := fake.NewClientset(byID, byName)
	bad := func(uuid, name, reason string) libvirtcloud.UnparsableDomain {
		return libvirtcloud.UnparsableDomain{UUID: uuid, Name: name, Hypervisor: "zone-a", Reason: reason}
	}
	h := &skippingHypervisor{events: make(chan libvirtcloud.Event, 8)}
	h.now(bad("aaaa", "dom-a", "value out of range"))
	rec := startUnparsable(ctx, t, client, h)
	for _, d := range []libvirtcloud.UnparsableDomain{
		bad("aaaa", "dom-a", "value out of range"), // the same again: not news
		bad("bbbb", "node-b", "bad memory unit"),
		bad("cccc", "no-node", "bad memory unit"),
		bad("aaaa", "dom-a", "another reason"),
	} {
		h.events <- libvirtcloud.Event{Unparsable: &d}
	}
	var got []string
	timeout := time.After(5 * time.Second)
	for len(got) < 3 {
		select {
		case e := <-rec.Events:
			got = append(got, e)
		case <-timeout:
			t.Fatalf("events so far: %q", got)
		}
	}
	select {
	case e := <-rec.Events:
		t.Errorf("one event too many: %q", e)
	case <-time.After(300 * time.Millisecond):
	}
	for i, want := range []string{"domain dom-a (uuid aaaa) on zone-a cannot be parsed: value out of range", "domain node-b (uuid bbbb)", "another reason"} {
		if !strings.HasPrefix(got[i], "Warning "+EventDomainUnparsable+" ") || !strings.Contains(got[i], want) {
			t.Errorf("event %d = %q, want a %s Warning with %q", i, got[i], EventDomainUnparsable, want)
		}
	}
}

// TestUnparsableDomainForgottenOnceItParses: a domain that parses again,
// or is undefined, leaves the reporter's table, so that the table holds
// only what is unparsable now, and a domain that breaks again, even for
// the same reason, warns its Node again.
func TestUnparsableDomainForgottenOnceItParses(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Spec: v1.NodeSpec{ProviderID: ProviderID("aaaa")}}
	client := fake.NewClientset(node)
	broken := libvirtcloud.UnparsableDomain{UUID: "aaaa", Name: "dom-a", Hypervisor: "zone-a", Reason: "value out of range"}
	h := &skippingHypervisor{events: make(chan libvirtcloud.Event, 8)}
	h.now(broken)
	rec := startUnparsable(ctx, t, client, h)
	warned := func(step string) {
		t.Helper()
		select {
		case e := <-rec.Events:
			if !strings.Contains(e, "domain dom-a (uuid aaaa) on zone-a cannot be parsed: value out of range") {
				t.Fatalf("%s: event %q", step, e)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no warning on node-a", step)
		}
	}
	warned("found unparsable")

	for _, fixed := range []libvirtcloud.Event{
		{Domain: libvirtcloud.Domain{UUID: "aaaa", Name: "dom-a", Hypervisor: "zone-a"}}, // parses now
		{Domain: libvirtcloud.Domain{UUID: "aaaa", Name: "dom-a", Hypervisor: "zone-a"}, Removed: true},
	} {
		asked := h.now()
		h.events <- fixed
		if !h.askedAfter(asked) {
			t.Errorf("removed %v: the reporter never asked again which domains are unparsable", fixed.Removed)
		}
		h.now(broken)
		h.events <- libvirtcloud.Event{Unparsable: &broken}
		warned(fmt.Sprintf("unparsable again for the same reason after it parsed (removed %v)", fixed.Removed))
	}
}

// startUnparsable starts a reporter of h's domains as SetInformers does,
// on client's Nodes, and returns its recorder.
func startUnparsable(ctx context.Context, t *testing.T, client *fake.Clientset, h *skippingHypervisor) *record.FakeRecorder {
	t.Helper()
	r := newUnparsableReporter([]Hypervisor{h})
	rec := record.NewFakeRecorder(16)
	factory := informers.NewSharedInformerFactory(client, 0)
	if err := r.start(ctx, client, factory, rec); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	return rec
}
