package placement

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stesting "k8s.io/client-go/testing"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/provider/internal/lbtest"
)

// otherCondition belongs to someone else: the placement must keep it.
var otherCondition = metav1.Condition{Type: "example.com/Other", Status: metav1.ConditionTrue, Reason: "Theirs",
	LastTransitionTime: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}

func withOtherCondition(s *v1.Service) { s.Status.Conditions = []metav1.Condition{otherCondition} }

// keptOther reports whether the Service still has otherCondition as it was.
func keptOther(s *v1.Service) bool {
	c := meta.FindStatusCondition(s.Status.Conditions, otherCondition.Type)
	return c != nil && c.Status == otherCondition.Status && c.Reason == otherCondition.Reason &&
		c.Message == otherCondition.Message && c.LastTransitionTime.Equal(&otherCondition.LastTransitionTime)
}

// announced returns the Service's Announced condition as the API has it.
func (f *fixture) announced(name string) (*metav1.Condition, *v1.Service) {
	f.t.Helper()
	s, err := f.client.CoreV1().Services("default").Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return meta.FindStatusCondition(s.Status.Conditions, lb.ConditionAnnounced), s
}

// waitAnnounced waits until the Service's Announced condition has this
// status and message.
func (f *fixture) waitAnnounced(name string, status metav1.ConditionStatus, reason, message string) metav1.Condition {
	f.t.Helper()
	var got *metav1.Condition
	f.WaitFor(fmt.Sprintf("condition %s %s %q", status, reason, message), func() bool {
		got, _ = f.announced(name)
		return got != nil && got.Status == status && got.Reason == reason && got.Message == message
	})
	return *got
}

// statusPatches counts the patches of services/status sent so far.
func (f *fixture) statusPatches() int {
	n := 0
	for _, a := range f.client.Actions() {
		if a.GetVerb() == "patch" && a.GetResource().Resource == "services" && a.GetSubresource() == "status" {
			n++
		}
	}
	return n
}

// TestAnnouncedConditionFollowsPlacement: the Service says which node
// answers and since when, across a failover and when no node can; it is
// written only when it changes, and never touches the load-balancer
// status or other conditions.
func TestAnnouncedConditionFollowsPlacement(t *testing.T) {
	f := newFixture(t, "10.0.0.10-10.0.0.12", lbtest.Service("web", withOtherCondition)).start()
	svc := lbtest.Service("web", withOtherCondition)
	vip := f.mustEnsure(svc)
	first, ok := lbtest.NodeOf(f.ann.MAC(vip))
	if !ok {
		t.Fatalf("answered by %v", f.ann.MAC(vip))
	}
	other := lbtest.OtherNode(first)
	// What the service controller writes with EnsureLoadBalancer's answer.
	_, s := f.announced("web")
	lbtest.WithStatusIP(vip.String())(s)
	if _, err := f.client.CoreV1().Services("default").UpdateStatus(f.ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	c1 := f.waitAnnounced("web", metav1.ConditionTrue, lb.ReasonAnnounced, fmt.Sprintf("%s answered by node %s (%s)", vip, first.Name, first.MAC))
	if c1.LastTransitionTime.IsZero() {
		t.Error("no lastTransitionTime")
	}

	// Steady state: passes and service syncs write nothing.
	f.WaitFor("the cache to show the condition", func() bool {
		s, err := f.p.services.Services("default").Get("web")
		return err == nil && meta.FindStatusCondition(s.Status.Conditions, lb.ConditionAnnounced) != nil
	})
	patches := f.statusPatches()
	for range 5 {
		f.p.Sync(f.ctx, nil)
		f.p.Sync(f.ctx, svc) // UpdateLoadBalancer
	}
	time.Sleep(100 * time.Millisecond) // the writer's queue is asynchronous
	if n := f.statusPatches() - patches; n != 0 {
		t.Errorf("%d status patches at steady state, want none", n)
	}

	// lastTransitionTime has one-second resolution: let a second pass so
	// the move's time is visibly later.
	time.Sleep(1100 * time.Millisecond)
	f.hv.SetState(first.Name, libvirtcloud.StateShutOff)
	c2 := f.waitAnnounced("web", metav1.ConditionTrue, lb.ReasonAnnounced, fmt.Sprintf("%s answered by node %s (%s)", vip, other.Name, other.MAC))
	if !c2.LastTransitionTime.After(c1.LastTransitionTime.Time) {
		t.Errorf("after the move lastTransitionTime %v, want later than %v", c2.LastTransitionTime, c1.LastTransitionTime)
	}

	f.hv.SetState(other.Name, libvirtcloud.StateCrashed)
	f.waitAnnounced("web", metav1.ConditionFalse, lb.ReasonNoEligibleNode, vip.String()+" answered by no node (none is eligible: it needs a running domain on the bridge, a Ready Node and, with externalTrafficPolicy Local, a ready endpoint)")
	_, s = f.announced("web")
	if got := s.Status.LoadBalancer.Ingress; len(got) != 1 || got[0].IP != vip.String() {
		t.Errorf("status.loadBalancer.ingress = %v, want the service controller's %s kept", got, vip)
	}
	if !keptOther(s) {
		t.Errorf("the other condition became %+v, want %+v kept", s.Status.Conditions, otherCondition)
	}

	// Released: the condition goes, the rest stays.
	f.release(svc)
	f.WaitFor("the condition removed", func() bool { c, _ := f.announced("web"); return c == nil })
	_, s = f.announced("web")
	if !keptOther(s) {
		t.Errorf("removing ours changed the other condition: %+v", s.Status.Conditions)
	}
}

// TestAnnouncedConditionPatchTouchesOnlyIt: the writes are strategic merge
// patches of status.conditions holding the one condition (or its delete
// directive): nothing else of the Service is in them.
func TestAnnouncedConditionPatchTouchesOnlyIt(t *testing.T) {
	f := newFixture(t, "10.0.0.10-10.0.0.12", lbtest.Service("web")).start()
	svc := lbtest.Service("web")
	f.mustEnsure(svc)
	f.WaitFor("a condition", func() bool { c, _ := f.announced("web"); return c != nil })
	f.release(svc)
	f.WaitFor("the condition removed", func() bool { c, _ := f.announced("web"); return c == nil })
	var bodies []string
	for _, a := range f.client.Actions() {
		p, ok := a.(k8stesting.PatchAction)
		if !ok || a.GetSubresource() != "status" {
			continue
		}
		if p.GetPatchType() != "application/strategic-merge-patch+json" {
			t.Errorf("patch type %s, want a strategic merge patch", p.GetPatchType())
		}
		var body struct {
			Status struct {
				Conditions []map[string]any `json:"conditions"`
			} `json:"status"`
		}
		var all map[string]any
		if err := json.Unmarshal(p.GetPatch(), &body); err != nil {
			t.Fatal(err)
		}
		_ = json.Unmarshal(p.GetPatch(), &all)
		status, _ := all["status"].(map[string]any)
		if len(all) != 1 || len(status) != 1 || len(body.Status.Conditions) != 1 || body.Status.Conditions[0]["type"] != lb.ConditionAnnounced {
			t.Errorf("patch %s touches more than the Announced condition", p.GetPatch())
		}
		bodies = append(bodies, string(p.GetPatch()))
	}
	if len(bodies) != 2 {
		t.Errorf("%d status patches, want 2 (set, delete): %q", len(bodies), bodies)
	}
}

// TestAnnouncedConditionRestoredAfterOthersChangeIt: someone else removing
// the condition gets it back (once the cache can no longer be lagging
// behind our own write), with its original lastTransitionTime.
func TestAnnouncedConditionRestoredAfterOthersChangeIt(t *testing.T) {
	f := newFixture(t, "10.0.0.10-10.0.0.12", lbtest.Service("web")).start()
	f.mustEnsure(lbtest.Service("web"))
	f.WaitFor("a condition", func() bool { c, _ := f.announced("web"); return c != nil })
	want, s := f.announced("web")
	s.Status.Conditions = nil
	if _, err := f.client.CoreV1().Services("default").UpdateStatus(f.ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.WaitFor("the cache to show the removal", func() bool {
		s, err := f.p.services.Services("default").Get("web")
		return err == nil && len(s.Status.Conditions) == 0
	})
	// Within the lag allowed for our own writes, nothing is rewritten ...
	f.p.Sync(f.ctx, nil)
	time.Sleep(50 * time.Millisecond)
	if c, _ := f.announced("web"); c != nil {
		t.Fatalf("rewritten at once: %+v", c)
	}
	// ... after it, the next pass restores it.
	f.p.conds.mu.Lock()
	for k, w := range f.p.conds.written {
		w.at = w.at.Add(-CacheLag)
		f.p.conds.written[k] = w
	}
	f.p.conds.mu.Unlock()
	f.p.Sync(f.ctx, nil)
	f.WaitFor("the condition restored", func() bool { c, _ := f.announced("web"); return c != nil })
	if got, _ := f.announced("web"); !got.LastTransitionTime.Equal(&want.LastTransitionTime) || !lb.SameAnnounced(*got, *want) {
		t.Errorf("restored %+v, want %+v", got, want)
	}
}

// TestAnnouncedConditionSharedVIP: every Service sharing a VIP says who
// answers it.
func TestAnnouncedConditionSharedVIP(t *testing.T) {
	shared := func(name string, port int32) *v1.Service {
		return lbtest.Service(name, lbtest.WithAnnotation(lb.AnnotationSharingKey, "k"), lbtest.WithPort(port))
	}
	f := newFixture(t, "10.0.0.10-10.0.0.12", shared("a", 80), shared("b", 443)).start()
	vip := f.mustEnsure(shared("a", 80))
	if got := f.mustEnsure(shared("b", 443)); got != vip {
		t.Fatalf("b got %s, want the shared %s", got, vip)
	}
	n, _ := lbtest.NodeOf(f.ann.MAC(vip))
	msg := fmt.Sprintf("%s answered by node %s (%s)", vip, n.Name, n.MAC)
	f.waitAnnounced("a", metav1.ConditionTrue, lb.ReasonAnnounced, msg)
	f.waitAnnounced("b", metav1.ConditionTrue, lb.ReasonAnnounced, msg)
}
