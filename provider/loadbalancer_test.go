package provider

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/cloud-provider/api"
	"k8s.io/utils/ptr"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/metrics"
	"github.com/labcloud/labcloud/provider/internal/follow"
	"github.com/labcloud/labcloud/provider/internal/lbtest"
	"github.com/labcloud/labcloud/provider/placement"
)

var (
	_ placement.Announcer = (*lbtest.Announcer)(nil)
	_ Hypervisor          = (*lbtest.Hypervisor)(nil)
	_ follow.DomainEvents = (*lbtest.Hypervisor)(nil)
)

var testNodes = lbtest.Nodes()

// lbFixture is a loadBalancer over fakes, started as Initialize starts it.
type lbFixture struct {
	lbtest.Cluster
	t      *testing.T
	ctx    context.Context
	lb     *loadBalancer
	ann    *lbtest.Announcer
	hv     *lbtest.Hypervisor
	in     *instances
	client *fake.Clientset
	events *lbtest.Events
	nodes  []*v1.Node
	served chan struct{} // closed once the started load balancer's loop ends
}

// newLBFixture builds the provider's load balancer over pool, with the
// given objects (Services, EndpointSlices) already in the cluster besides
// the two Nodes; the caller starts it.
func newLBFixture(t *testing.T, pool string, objects ...runtime.Object) *lbFixture {
	t.Helper()
	return newLBFixtureOf(t, []lb.PoolConfig{{Name: "test", Addresses: []string{pool}}}, objects...)
}

// newLBFixtureOf is newLBFixture over several pools.
func newLBFixtureOf(t *testing.T, pools []lb.PoolConfig, objects ...runtime.Object) *lbFixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := &lbFixture{t: t, ctx: ctx, ann: lbtest.NewAnnouncer(), hv: lbtest.NewHypervisor(testNodes), events: lbtest.NewEvents()}
	for _, n := range testNodes {
		obj := n.Object()
		f.nodes = append(f.nodes, obj)
		objects = append(objects, obj)
	}
	f.client = fake.NewClientset(objects...)
	f.Cluster = lbtest.NewCluster(t, ctx, f.client, f.events)
	cfg := DefaultConfig()
	f.in = &instances{cfg: &cfg, hypervisors: []Hypervisor{f.hv}}
	l := newLoadBalancerWith(lbConfig(t, pools), []Hypervisor{f.hv}, f.in, f.ann, nil, nil)
	f.lb = l
	// After its test, no pass of this fixture may run: the placement loop
	// outlives ctx by the pass it is in, and the pass metrics are the
	// process's. Its end is waited for.
	t.Cleanup(func() {
		cancel()
		if f.served == nil {
			return
		}
		select {
		case <-f.served:
		case <-time.After(10 * time.Second):
			t.Error("a placement pass still runs 10 s after its test")
		}
	})
	return f
}

// start runs the load balancer as SetInformers does (start), with the
// FakeRecorder in place of the provider's recorder.
func (f *lbFixture) start() *lbFixture {
	f.t.Helper()
	factory := informers.NewSharedInformerFactory(f.client, 0)
	if err := f.lb.lead(f.ctx, f.client, factory, f.events.Recorder); err != nil {
		f.t.Fatal(err)
	}
	f.served = make(chan struct{})
	go func() {
		defer close(f.served)
		f.lb.serve(f.ctx)
	}()
	factory.Start(f.ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(f.ctx.Done()) {
		if !ok {
			f.t.Fatalf("informer for %v did not sync", typ)
		}
	}
	return f
}

func (f *lbFixture) ensure(svc *v1.Service) (*v1.LoadBalancerStatus, error) {
	return f.lb.EnsureLoadBalancer(f.ctx, "test", svc, f.nodes)
}

// mustEnsure returns the Service's one VIP.
func (f *lbFixture) mustEnsure(svc *v1.Service) netip.Addr {
	f.t.Helper()
	st, err := f.ensure(svc)
	if err != nil {
		f.t.Fatalf("EnsureLoadBalancer(%s): %v", svc.Name, err)
	}
	if len(st.Ingress) != 1 {
		f.t.Fatalf("EnsureLoadBalancer(%s) = %+v, want one ingress", svc.Name, st.Ingress)
	}
	ing := st.Ingress[0]
	if ing.IPMode == nil || *ing.IPMode != v1.LoadBalancerIPModeVIP {
		f.t.Errorf("ingress %s ipMode = %v, want VIP", ing.IP, ing.IPMode)
	}
	return netip.MustParseAddr(ing.IP)
}

// The Service is in the cache, as the service controller's are: a pass of
// the placement loop that runs before the call's own may be the one that
// announces the VIP, and it finds the Service there for its event.
func TestLoadBalancerAllocatesFromPoolAndAnnounces(t *testing.T) {
	svc := lbtest.Service("web")
	f := newLBFixture(t, "10.0.0.10-10.0.0.12", svc).start()
	vip := f.mustEnsure(svc)
	if vip != netip.MustParseAddr("10.0.0.10") {
		t.Fatalf("VIP = %s, want the pool's first address 10.0.0.10", vip)
	}
	mac := f.ann.MAC(vip)
	if _, ok := lbtest.NodeOf(mac); !ok {
		t.Fatalf("VIP answered by %v, want a node's NIC on the bridge", mac)
	}
	if got := len(f.ann.Probes()); got != 1 {
		t.Errorf("%d probes before announcing, want 1", got)
	}
	if f.Count(v1.EventTypeNormal, ReasonAllocated) != 1 || f.Count(v1.EventTypeNormal, placement.ReasonVIPAnnounced) != 1 {
		t.Errorf("events = %q, want one %s and one %s", f.Drain(), ReasonAllocated, placement.ReasonVIPAnnounced)
	}

	// A second sync changes nothing and says nothing: at most it mends the
	// same answer (a keep that repairs counts as a set).
	sets := len(f.ann.SetsFor(vip))
	if again := f.mustEnsure(svc); again != vip {
		t.Fatalf("second EnsureLoadBalancer moved the VIP %s -> %s", vip, again)
	}
	if len(f.ann.Probes()) != 1 || len(f.ann.SetsFor(vip)) > sets+1 || f.ann.MAC(vip).String() != mac.String() {
		t.Errorf("second sync: probes %v, sets %v; want no new probe and the same MAC", f.ann.Probes(), f.ann.SetsFor(vip))
	}
	if events := f.Drain(); len(events) != 2 {
		t.Errorf("second sync added events: %q", events)
	}
	st, exists, err := f.lb.GetLoadBalancer(f.ctx, "test", svc)
	if err != nil || !exists || len(st.Ingress) != 1 || st.Ingress[0].IP != vip.String() {
		t.Fatalf("GetLoadBalancer = %+v, %v, %v; want %s", st, exists, err, vip)
	}
	if next := f.mustEnsure(lbtest.Service("api")); next != netip.MustParseAddr("10.0.0.11") {
		t.Errorf("second Service got %s, want 10.0.0.11", next)
	}
}

// A restarted CCM loads every VIP from the Service statuses before it hands
// out any: a new Service synced first never gets an address another holds.
func TestLoadBalancerLoadsStatusesBeforeAllocating(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.13",
		lbtest.Service("old-1", lbtest.WithStatusIP("10.0.0.11")),
		lbtest.Service("old-2", lbtest.WithStatusIP("10.0.0.10")),
		lbtest.Service("foreign", lbtest.WithStatusIP("192.0.2.1"), func(s *v1.Service) { s.Spec.LoadBalancerClass = ptr.To("example.com/other") }),
		lbtest.Service("cluster-ip", lbtest.WithStatusIP("10.0.0.12"), func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeClusterIP }),
	)

	// Nothing is served before the assignments are loaded.
	early, cancel := context.WithTimeout(f.ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := f.lb.EnsureLoadBalancer(early, "test", lbtest.Service("new-0"), f.nodes); err == nil {
		t.Fatal("EnsureLoadBalancer allocated before the existing assignments were loaded")
	}
	f.start()

	st, exists, err := f.lb.GetLoadBalancer(f.ctx, "test", lbtest.Service("old-2"))
	if err != nil || !exists || st.Ingress[0].IP != "10.0.0.10" {
		t.Fatalf("GetLoadBalancer(old-2) before its first sync = %+v, %v, %v; want 10.0.0.10 from its status", st, exists, err)
	}
	// New Services first, in the order that would collide without load().
	// The ClusterIP Service's stale status does not hold 10.0.0.12.
	if got := f.mustEnsure(lbtest.Service("new-1")); got != netip.MustParseAddr("10.0.0.12") {
		t.Errorf("new-1 got %s, want 10.0.0.12 (10.0.0.10 and .11 are held by statuses)", got)
	}
	if got := f.mustEnsure(lbtest.Service("new-2")); got != netip.MustParseAddr("10.0.0.13") {
		t.Errorf("new-2 got %s, want 10.0.0.13", got)
	}
	_, err = f.ensure(lbtest.Service("new-3"))
	var exhausted *lb.PoolExhaustedError
	if !errors.As(err, &exhausted) {
		t.Errorf("new-3: err = %v, want pool exhausted", err)
	}
	if f.Count(v1.EventTypeWarning, ReasonExhausted) != 1 {
		t.Errorf("events = %q, want one %s", f.Drain(), ReasonExhausted)
	}
	// The loaded Services keep their addresses, without an allocation event.
	before := f.Count(v1.EventTypeNormal, ReasonAllocated)
	if got := f.mustEnsure(lbtest.Service("old-1")); got != netip.MustParseAddr("10.0.0.11") {
		t.Errorf("old-1 moved to %s, want its status address 10.0.0.11", got)
	}
	if got := f.mustEnsure(lbtest.Service("old-2")); got != netip.MustParseAddr("10.0.0.10") {
		t.Errorf("old-2 moved to %s, want its status address 10.0.0.10", got)
	}
	if after := f.Count(v1.EventTypeNormal, ReasonAllocated); after != before {
		t.Errorf("re-syncing loaded Services emitted %d %s events", after-before, ReasonAllocated)
	}
}

func TestLoadBalancerConflictProbe(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12").start()
	conflicts := lbtest.Counter(t, metrics.IPConflicts)
	vip := netip.MustParseAddr("10.0.0.10")
	rogue := net.HardwareAddr{0x02, 0xde, 0xad, 0xbe, 0xef, 0x01}
	f.ann.SetForeign(vip, rogue)
	svc := lbtest.Service("web")
	for range 3 { // the service controller retries
		if _, err := f.ensure(svc); err == nil || !strings.Contains(err.Error(), rogue.String()) {
			t.Fatalf("EnsureLoadBalancer with %s owned by %s: err = %v", vip, rogue, err)
		}
	}
	if sets := f.ann.SetsFor(vip); len(sets) != 0 {
		t.Fatalf("a VIP another host answers for was announced: %v", sets)
	}
	if n := f.Count(v1.EventTypeWarning, ReasonConflict); n != 1 {
		t.Fatalf("%d %s events over 3 retries, want 1: %q", n, ReasonConflict, f.Drain())
	}
	if f.Count(v1.EventTypeNormal, placement.ReasonVIPAnnounced) != 0 {
		t.Fatalf("conflicting VIP reported announced: %q", f.Drain())
	}
	// The failover loop leaves an unprobed VIP alone.
	f.lb.place.Sync(f.ctx, nil)
	if sets := f.ann.SetsFor(vip); len(sets) != 0 {
		t.Fatalf("failover loop announced a conflicting VIP: %v", sets)
	}

	// The other host goes away: the next retry announces.
	f.ann.SetForeign(vip, nil)
	if got := f.mustEnsure(svc); got != vip {
		t.Fatalf("after the conflict cleared: VIP %s, want %s", got, vip)
	}
	if _, ok := lbtest.NodeOf(f.ann.MAC(vip)); !ok {
		t.Fatalf("after the conflict cleared: answered by %v", f.ann.MAC(vip))
	}

	// A node answering for the address as its own is a conflict too: the
	// VIP would split its traffic between that node and the announced one.
	next := netip.MustParseAddr("10.0.0.11")
	f.ann.SetForeign(next, testNodes[1].MAC)
	if _, err := f.ensure(lbtest.Service("api")); err == nil || !strings.Contains(err.Error(), testNodes[1].MAC.String()) {
		t.Fatalf("%s answered by node %s was claimed: err = %v", next, testNodes[1].Name, err)
	}
	if sets := f.ann.SetsFor(next); len(sets) != 0 {
		t.Fatalf("a node's own address was announced as a VIP: %v", sets)
	}
	if n := conflicts(); n != 4 {
		t.Errorf("labcloud_lb_ip_conflicts_total grew by %v, want 4 (three retries, one node)", n)
	}
}

func TestLoadBalancerWarnsOncePerBadRequest(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12").start()
	bad := lbtest.Service("web", lbtest.WithAnnotation(lb.AnnotationIP, "10.0.0.300"))
	for range 3 {
		if _, err := f.ensure(bad); err == nil {
			t.Fatal("a malformed lb.labcloud.io/ip was accepted")
		}
	}
	if n := f.Count(v1.EventTypeWarning, ReasonInvalidRequest); n != 1 {
		t.Fatalf("%d %s events for the same bad value over 3 retries, want 1: %q", n, ReasonInvalidRequest, f.Drain())
	}
	// A different bad value is news.
	worse := lbtest.Service("web", lbtest.WithAnnotation(lb.AnnotationIP, "0.0.0.0"))
	for range 2 {
		_, _ = f.ensure(worse)
	}
	if n := f.Count(v1.EventTypeWarning, ReasonInvalidRequest); n != 2 {
		t.Fatalf("%d %s events after the value changed, want 2", n, ReasonInvalidRequest)
	}
	// Outside every pool: its own reason, once.
	outside := lbtest.Service("web", lbtest.WithAnnotation(lb.AnnotationIP, "192.0.2.7"))
	for range 2 {
		_, _ = f.ensure(outside)
	}
	if n := f.Count(v1.EventTypeWarning, ReasonNotInPool); n != 1 {
		t.Fatalf("%d %s events, want 1: %q", n, ReasonNotInPool, f.Drain())
	}
	// Fixed: served; broken again later: warned again.
	if got := f.mustEnsure(lbtest.Service("web", lbtest.WithAnnotation(lb.AnnotationIP, "10.0.0.12"))); got != netip.MustParseAddr("10.0.0.12") {
		t.Fatalf("requested 10.0.0.12, got %s", got)
	}
	_, _ = f.ensure(bad)
	if n := f.Count(v1.EventTypeWarning, ReasonInvalidRequest); n != 3 {
		t.Fatalf("%d %s events after the value broke again, want 3", n, ReasonInvalidRequest)
	}
}

// TestLoadBalancerWaitingServiceRetriesSoon: a Service waiting for an
// address gets a RetryError (the service controller requeues it after a
// short delay), and nothing writes to any Service to make it resync.
func TestLoadBalancerWaitingServiceRetriesSoon(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12",
		lbtest.Service("first"), lbtest.Service("second")).start()
	want := lbtest.WithAnnotation(lb.AnnotationIP, "10.0.0.11")
	first, second := lbtest.Service("first", want), lbtest.Service("second", want)
	if got := f.mustEnsure(first); got != netip.MustParseAddr("10.0.0.11") {
		t.Fatalf("first got %s", got)
	}
	for range 2 {
		_, err := f.ensure(second)
		var re *api.RetryError
		if !errors.Is(err, lb.ErrIPTaken) || !errors.As(err, &re) || re.RetryAfter() <= 0 || re.RetryAfter() > 10*time.Second {
			t.Fatalf("second: err = %v, want the address taken as a short RetryError", err)
		}
	}
	if n := f.Count(v1.EventTypeWarning, ReasonTaken); n != 1 {
		t.Fatalf("%d %s events, want 1: %q", n, ReasonTaken, f.Drain())
	}
	f.client.ClearActions()
	if err := f.lb.EnsureLoadBalancerDeleted(f.ctx, "test", first); err != nil {
		t.Fatal(err)
	}
	for _, a := range f.client.Actions() {
		if a.GetResource().Resource != "services" || a.GetVerb() == "get" || a.GetVerb() == "list" || a.GetVerb() == "watch" {
			continue
		}
		// The one write allowed: the placement condition of the released
		// Service going away (no nudge: the service controller does not
		// resync a Service for a status change).
		if p, ok := a.(k8stesting.PatchAction); ok && a.GetSubresource() == "status" && p.GetName() == "first" &&
			strings.Contains(string(p.GetPatch()), lb.ConditionAnnounced) {
			continue
		}
		t.Errorf("the provider wrote to a Service: %s %s/%s", a.GetVerb(), a.GetResource().Resource, a.GetSubresource())
	}
	if ip := f.mustEnsure(second); ip != netip.MustParseAddr("10.0.0.11") {
		t.Fatalf("second got %s after first was deleted, want 10.0.0.11", ip)
	}
}

func TestLoadBalancerDeleteReleases(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10/32").start()
	svc := lbtest.Service("web")
	vip := f.mustEnsure(svc)
	if err := f.lb.EnsureLoadBalancerDeleted(f.ctx, "test", svc); err != nil {
		t.Fatal(err)
	}
	if !f.ann.Removed(vip) || f.ann.MAC(vip) != nil {
		t.Fatalf("%s still announced after delete", vip)
	}
	st, exists, err := f.lb.GetLoadBalancer(f.ctx, "test", svc)
	if err != nil || exists {
		t.Fatalf("GetLoadBalancer after delete = %+v, %v, %v; want not found, so the finalizer goes", st, exists, err)
	}
	if f.Count(v1.EventTypeNormal, ReasonReleased) != 1 {
		t.Fatalf("events = %q, want one %s", f.Drain(), ReasonReleased)
	}
	// Deleting again (the finalizer retry) is harmless and silent.
	if err := f.lb.EnsureLoadBalancerDeleted(f.ctx, "test", svc); err != nil {
		t.Fatal(err)
	}
	if f.Count(v1.EventTypeNormal, ReasonReleased) != 1 {
		t.Fatalf("second delete emitted another %s", ReasonReleased)
	}
	// The only address is free again, and is probed again before reuse.
	if got := f.mustEnsure(lbtest.Service("api")); got != vip {
		t.Fatalf("api got %s, want the released %s", got, vip)
	}
	if len(f.ann.Probes()) != 2 {
		t.Errorf("probes = %v, want the reused address probed again", f.ann.Probes())
	}
}

func TestLoadBalancerSharedVIPStaysUntilLastHolder(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12").start()
	share := lbtest.WithAnnotation(lb.AnnotationSharingKey, "team-a")
	web, dns := lbtest.Service("web", share, lbtest.WithPort(80)), lbtest.Service("dns", share, lbtest.WithPort(53))
	vip := f.mustEnsure(web)
	if got := f.mustEnsure(dns); got != vip {
		t.Fatalf("dns got %s, want the shared %s", got, vip)
	}
	if err := f.lb.EnsureLoadBalancerDeleted(f.ctx, "test", web); err != nil {
		t.Fatal(err)
	}
	if f.ann.Removed(vip) || f.ann.MAC(vip) == nil {
		t.Fatalf("shared %s stopped being announced while dns still holds it", vip)
	}
	if err := f.lb.EnsureLoadBalancerDeleted(f.ctx, "test", dns); err != nil {
		t.Fatal(err)
	}
	if !f.ann.Removed(vip) {
		t.Fatalf("%s still announced after its last holder was deleted", vip)
	}
}

func TestLoadBalancerFailoverOnDomainEvent(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12", lbtest.Service("web")).start()
	svc := lbtest.Service("web")
	vip := f.mustEnsure(svc)
	first, ok := lbtest.NodeOf(f.ann.MAC(vip))
	if !ok {
		t.Fatalf("answered by %v", f.ann.MAC(vip))
	}
	other := lbtest.OtherNode(first)
	moves := lbtest.Counter(t, metrics.VIPMoves.WithLabelValues(metrics.MoveDomainDown))

	// The answering node's domain shuts off: the other node answers.
	f.hv.SetState(first.Name, libvirtcloud.StateShutOff)
	f.WaitFor("move to "+other.Name, func() bool { return f.ann.MAC(vip).String() == other.MAC.String() })
	f.WaitFor(placement.ReasonVIPMoved+" event", func() bool { return f.Count(v1.EventTypeNormal, placement.ReasonVIPMoved) == 1 })
	if n := moves(); n != 1 {
		t.Errorf("%v moves with reason %s, want 1", n, metrics.MoveDomainDown)
	}
	// The move is timed from the libvirt event to its first gratuitous ARP.
	causes := f.ann.Causes()
	if down := f.hv.Domain(first.Name).DownEventAt; len(causes) != 1 || !causes[0].Equal(down) {
		t.Errorf("SetAfter causes %v, want the domain's stop event at %v", causes, down)
	}

	// The other one crashes too: nobody answers, and the Service hears it.
	f.hv.SetState(other.Name, libvirtcloud.StateCrashed)
	f.WaitFor("VIP withdrawn", func() bool { return f.ann.MAC(vip) == nil })
	f.WaitFor("NoEligibleNode event", func() bool { return f.Count(v1.EventTypeWarning, placement.ReasonNoNodeForVIP) == 1 })

	// The first comes back, but its guest is still booting: its Node has
	// not reported since the domain started, so it does not answer yet.
	f.hv.SetState(first.Name, libvirtcloud.StateRunning)
	f.lb.place.Sync(f.ctx, nil)
	if got := f.ann.MAC(vip); got != nil {
		t.Fatalf("VIP handed to %v before the restarted node reported", got)
	}
	// Its kubelet reports: it answers again.
	n := first.Object()
	n.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(time.Now().Add(time.Second))
	if _, err := f.client.CoreV1().Nodes().UpdateStatus(f.ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.WaitFor("re-announced via "+first.Name, func() bool { return f.ann.MAC(vip).String() == first.MAC.String() })
	if n := len(f.ann.Probes()); n != 1 {
		t.Errorf("failover probed %d times; the address was claimed once", n)
	}
}

// A VIP whose node is gone moves, and the move says why: placement finds
// the node it leaves by the last pass's facts of its MAC, since neither the
// Node nor the domain is there to ask.
func TestLoadBalancerFailoverWhenNodeOrDomainIsGone(t *testing.T) {
	for _, tc := range []struct {
		name, reason string
		gone         func(f *lbFixture, n lbtest.Node)
	}{
		{"Node deleted", metrics.MoveNodeDeleted, func(f *lbFixture, n lbtest.Node) {
			if err := f.client.CoreV1().Nodes().Delete(f.ctx, n.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"domain undefined", metrics.MoveDomainDown, func(f *lbFixture, n lbtest.Node) { f.hv.Undefine(n.Name) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newLBFixture(t, "10.0.0.10-10.0.0.12", lbtest.Service("web")).start()
			vip := f.mustEnsure(lbtest.Service("web"))
			first, ok := lbtest.NodeOf(f.ann.MAC(vip))
			if !ok {
				t.Fatalf("answered by %v", f.ann.MAC(vip))
			}
			other := lbtest.OtherNode(first)
			moves := lbtest.Counter(t, metrics.VIPMoves.WithLabelValues(tc.reason))

			tc.gone(f, first)
			f.WaitFor("move to "+other.Name, func() bool { return f.ann.MAC(vip).String() == other.MAC.String() })
			if n := moves(); n != 1 {
				t.Errorf("%v moves with reason %s, want 1", n, tc.reason)
			}
			f.WaitFor(placement.ReasonVIPMoved+" event", func() bool { return f.Count(v1.EventTypeNormal, placement.ReasonVIPMoved) == 1 })
			want := fmt.Sprintf("%s moved from node %s to node %s", vip, first.Name, other.Name)
			if ev := f.Drain(); !slices.ContainsFunc(ev, func(e string) bool { return strings.Contains(e, want) }) {
				t.Errorf("events %q, want one saying %q", ev, want)
			}
		})
	}
}

func TestLoadBalancerFailoverOnNodeNotReady(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12", lbtest.Service("web")).start()
	vip := f.mustEnsure(lbtest.Service("web"))
	first, _ := lbtest.NodeOf(f.ann.MAC(vip))
	other := lbtest.OtherNode(first)

	notReady := lbtest.Counter(t, metrics.VIPMoves.WithLabelValues(metrics.MoveNodeNotReady))
	rebalance := lbtest.Counter(t, metrics.VIPMoves.WithLabelValues(metrics.MoveRebalance))

	n := first.Object()
	n.Status.Conditions[0].Status = v1.ConditionFalse
	if _, err := f.client.CoreV1().Nodes().UpdateStatus(f.ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.WaitFor("move off the NotReady node", func() bool { return f.ann.MAC(vip).String() == other.MAC.String() })
	if n := notReady(); n != 1 {
		t.Errorf("%v moves with reason %s, want 1", n, metrics.MoveNodeNotReady)
	}

	// Back to Ready: the VIP goes back to the node the placement function
	// gives it, as any replica or a restarted CCM would compute.
	n.Status.Conditions[0].Status = v1.ConditionTrue
	if _, err := f.client.CoreV1().Nodes().UpdateStatus(f.ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.WaitFor("back on "+first.Name, func() bool { return f.ann.MAC(vip).String() == first.MAC.String() })
	if n := rebalance(); n != 1 {
		t.Errorf("%v moves with reason %s, want 1", n, metrics.MoveRebalance)
	}
	if causes := f.ann.Causes(); len(causes) != 0 {
		t.Errorf("moves not caused by libvirt events were timed: %v", causes)
	}
}

func TestLoadBalancerSkipsNodesOffTheBridge(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12")
	// node-b's domain has no NIC on the bridge.
	d := f.hv.Domain(testNodes[1].Name)
	d.Interfaces = d.Interfaces[:1]
	f.hv.Put(d)
	f.start()
	for i := range 3 {
		vip := f.mustEnsure(lbtest.Service(fmt.Sprintf("svc-%d", i)))
		if got := f.ann.MAC(vip); got.String() != testNodes[0].MAC.String() {
			t.Fatalf("%s answered by %v, want node-a's bridge NIC %s", vip, got, testNodes[0].MAC)
		}
	}
}

// TestVIPStaysWhileEveryNodeIsUnknown: after a control-plane outage
// kube-controller-manager marks every Node Unknown until the kubelets
// report again. Their domains run, so the VIP stays where it is instead of
// going dark; a Node that reports Ready takes it, and a Node its kubelet
// reports NotReady gives it up.
func TestVIPStaysWhileEveryNodeIsUnknown(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12", lbtest.Service("web")).start()
	vip := f.mustEnsure(lbtest.Service("web"))
	first, _ := lbtest.NodeOf(f.ann.MAC(vip))
	other := lbtest.OtherNode(first)

	// Unknown for longer than the hold: only a Ready node would take it.
	long := time.Now().Add(-2 * placement.UnknownHold)
	f.SetReady(other, v1.ConditionUnknown, long)
	f.SetReady(first, v1.ConditionUnknown, long)
	time.Sleep(100 * time.Millisecond) // the loop's passes on both updates
	f.lb.place.Sync(f.ctx, nil)
	if f.ann.Removed(vip) || f.ann.MAC(vip).String() != first.MAC.String() {
		t.Fatalf("with every Node Unknown the VIP went from %s to %v (removed: %v); events %q",
			first.MAC, f.ann.MAC(vip), f.ann.Removed(vip), f.Drain())
	}

	f.SetReady(other, v1.ConditionTrue, time.Now())
	f.WaitFor("move to the Node that reported Ready", func() bool { return f.ann.MAC(vip).String() == other.MAC.String() })

	f.SetReady(first, v1.ConditionUnknown, long)
	f.SetReady(other, v1.ConditionFalse, time.Now())
	f.WaitFor("withdrawn from the Node its kubelet reports NotReady", func() bool { return f.ann.Removed(vip) && f.ann.MAC(vip) == nil })
}

// TestUnknownNodeKeepsVIPsForTheHold: the kubelets report again one by one
// after a control-plane outage. The first node back Ready does not take the
// VIPs of nodes that went Unknown less than placement.UnknownHold ago; once their
// hold is over, a pass (with no other change to start it) moves them.
func TestUnknownNodeKeepsVIPsForTheHold(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12", lbtest.Service("web")).start()
	vip := f.mustEnsure(lbtest.Service("web"))
	first, _ := lbtest.NodeOf(f.ann.MAC(vip))
	other := lbtest.OtherNode(first)

	f.SetReady(first, v1.ConditionUnknown, time.Now())
	f.SetReady(other, v1.ConditionTrue, time.Now())
	time.Sleep(100 * time.Millisecond) // the loop's passes on both updates
	f.lb.place.Sync(f.ctx, nil)
	if got := f.ann.MAC(vip); got.String() != first.MAC.String() {
		t.Fatalf("the VIP left the node Unknown for 0 s of the %v hold: answered by %v, want %s; events %q", placement.UnknownHold, got, first.MAC, f.Drain())
	}

	// The hold ends 1 s from now (room for a loaded machine to make the
	// check below first); nothing else changes after this.
	f.SetReady(first, v1.ConditionUnknown, time.Now().Add(time.Second-placement.UnknownHold))
	time.Sleep(100 * time.Millisecond)
	if got := f.ann.MAC(vip); got.String() != first.MAC.String() {
		t.Fatalf("the VIP left before its hold ended: answered by %v, want %s", got, first.MAC)
	}
	f.WaitFor("move to the Ready node once the hold is over", func() bool { return f.ann.MAC(vip).String() == other.MAC.String() })
}

// lbConfig is the defaults with a load balancer of pools on lbtest.Bridge, as
// loading resolves it.
func lbConfig(t *testing.T, pools []lb.PoolConfig) *Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.LoadBalancer = LoadBalancerConfig{Bridge: lbtest.Bridge, Pools: pools}
	cfg = resolvedOf(t, cfg)
	return &cfg
}
