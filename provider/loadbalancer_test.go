package provider

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/cloud-provider/api"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/utils/ptr"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/metrics"
	"github.com/labcloud/labcloud/provider/internal/follow"
)

// fakeAnnouncer records what the provider asks of the bridge. Probe reports
// a foreign owner for the addresses listed in foreign; ProbeFor, whether
// that owner is the MAC asked for.
type fakeAnnouncer struct {
	mu      sync.Mutex
	owned   map[netip.Addr]net.HardwareAddr
	foreign map[netip.Addr]net.HardwareAddr
	sets    []string // "ip mac", in order
	removes []netip.Addr
	probes  []netip.Addr
	causes  []time.Time // non-zero causes given to SetAfter
	// hold, if set, keeps each Answering call waiting until it is closed;
	// held counts the calls that waited.
	hold chan struct{}
	held int
}

var _ Announcer = (*fakeAnnouncer)(nil)

func newFakeAnnouncer() *fakeAnnouncer {
	return &fakeAnnouncer{owned: map[netip.Addr]net.HardwareAddr{}, foreign: map[netip.Addr]net.HardwareAddr{}}
}

func (a *fakeAnnouncer) SetAfter(vip netip.Addr, mac net.HardwareAddr, cause time.Time) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.owned[vip] = mac
	a.sets = append(a.sets, vip.String()+" "+mac.String())
	if !cause.IsZero() {
		a.causes = append(a.causes, cause)
	}
	return nil
}

func (a *fakeAnnouncer) Remove(vip netip.Addr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.owned, vip)
	a.removes = append(a.removes, vip)
	return nil
}

func (a *fakeAnnouncer) Probe(_ context.Context, vip netip.Addr) (net.HardwareAddr, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.probes = append(a.probes, vip)
	if mac, ok := a.foreign[vip]; ok {
		return mac, true, nil
	}
	return nil, false, nil
}

func (a *fakeAnnouncer) ProbeFor(_ context.Context, ip netip.Addr, mac net.HardwareAddr) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.probes = append(a.probes, ip)
	return bytes.Equal(a.foreign[ip], mac), nil
}

func (a *fakeAnnouncer) Answering() map[netip.Addr]net.HardwareAddr {
	a.mu.Lock()
	if hold := a.hold; hold != nil {
		a.held++
		a.mu.Unlock()
		<-hold
		a.mu.Lock()
	}
	defer a.mu.Unlock()
	out := map[netip.Addr]net.HardwareAddr{}
	for ip, mac := range a.owned {
		out[ip] = mac
	}
	return out
}

func (a *fakeAnnouncer) Owned(vip netip.Addr) (net.HardwareAddr, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	mac, ok := a.owned[vip]
	return mac, ok
}

func (a *fakeAnnouncer) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

func (a *fakeAnnouncer) setForeign(vip netip.Addr, mac net.HardwareAddr) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if mac == nil {
		delete(a.foreign, vip)
		return
	}
	a.foreign[vip] = mac
}

// answering is the MAC that answers for vip now, nil if none.
func (a *fakeAnnouncer) answering(vip netip.Addr) net.HardwareAddr {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.owned[vip]
}

func (a *fakeAnnouncer) setsFor(vip netip.Addr) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, s := range a.sets {
		if strings.HasPrefix(s, vip.String()+" ") {
			out = append(out, s)
		}
	}
	return out
}

func (a *fakeAnnouncer) removed(vip netip.Addr) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.removes {
		if r == vip {
			return true
		}
	}
	return false
}

// fakeHypervisor is a Hypervisor with DomainEvents whose domains the test
// starts and stops.
type fakeHypervisor struct {
	mu   sync.Mutex
	doms map[string]libvirtcloud.Domain // by UUID
	subs []chan libvirtcloud.Event
	down bool // the daemon cannot be asked
}

func (h *fakeHypervisor) Connected() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.down
}

func (h *fakeHypervisor) setDown(down bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.down = down
}

var (
	_ Hypervisor          = (*fakeHypervisor)(nil)
	_ follow.DomainEvents = (*fakeHypervisor)(nil)
)

func (h *fakeHypervisor) Zone() string { return "zone-a" }

func (h *fakeHypervisor) DomainByUUID(uuid string) (libvirtcloud.Domain, error) {
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

func (h *fakeHypervisor) DomainByName(name string) (libvirtcloud.Domain, error) {
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

func (h *fakeHypervisor) DomainByAddress(_ context.Context, ip netip.Addr) (libvirtcloud.Domain, error) {
	return libvirtcloud.Domain{}, fmt.Errorf("address %s: %w", ip, libvirtcloud.ErrNotFound)
}

func (h *fakeHypervisor) Addresses(context.Context, libvirtcloud.Domain) ([]netip.Addr, error) {
	return nil, nil
}

func (h *fakeHypervisor) Subscribe() (<-chan libvirtcloud.Event, func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := make(chan libvirtcloud.Event, 16)
	h.subs = append(h.subs, ch)
	return ch, func() {}
}

// setState changes a domain's state and publishes the event, as the
// libvirt cache does on a lifecycle event.
func (h *fakeHypervisor) setState(name string, st libvirtcloud.State) {
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

// undefine removes a domain and publishes the event, as the libvirt cache
// does when a domain is undefined.
func (h *fakeHypervisor) undefine(name string) {
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

// domain returns the named domain as the fake holds it now.
func (h *fakeHypervisor) domain(name string) libvirtcloud.Domain {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, d := range h.doms {
		if d.Name == name {
			return d
		}
	}
	return libvirtcloud.Domain{}
}

// counter reads a counter now and returns how much it has grown since.
func counter(t *testing.T, c k8smetrics.CounterMetric) func() float64 {
	t.Helper()
	read := func() float64 {
		v, err := testutil.GetCounterMetricValue(c)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	start := read()
	return func() float64 { return read() - start }
}

const testBridge = "br-test"

// testNode is one Node with a running domain that has a NIC on the bridge.
type testNode struct {
	name, uuid string
	mac        net.HardwareAddr
}

var testNodes = []testNode{
	{"node-a", "aaaaaaaa-0000-0000-0000-000000000001", net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x0a}},
	{"node-b", "bbbbbbbb-0000-0000-0000-000000000002", net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x0b}},
}

func (n testNode) object() *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.name},
		Spec:       v1.NodeSpec{ProviderID: ProviderID(n.uuid)},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{
			{Type: v1.NodeReady, Status: v1.ConditionTrue},
		}},
	}
}

// lbFixture is a loadBalancer over fakes, started as Initialize starts it.
type lbFixture struct {
	t      *testing.T
	ctx    context.Context
	lb     *loadBalancer
	ann    *fakeAnnouncer
	hv     *fakeHypervisor
	client *fake.Clientset
	rec    *record.FakeRecorder
	nodes  []*v1.Node

	evMu   sync.Mutex
	events []string // "Type Reason message", drained from rec
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
	hv := &fakeHypervisor{doms: map[string]libvirtcloud.Domain{}}
	f := &lbFixture{t: t, ctx: ctx, ann: newFakeAnnouncer(), hv: hv, rec: record.NewFakeRecorder(1000)}
	for _, n := range testNodes {
		hv.doms[n.uuid] = libvirtcloud.Domain{UUID: n.uuid, Name: n.name, Hypervisor: "zone-a", State: libvirtcloud.StateRunning,
			Interfaces: []libvirtcloud.Interface{
				{MAC: "52:54:00:99:99:99", Network: "other", Bridge: "virbr9"}, // not on the bridge: never announced
				{MAC: n.mac.String(), Network: "lab", Bridge: testBridge},
			}}
		obj := n.object()
		f.nodes = append(f.nodes, obj)
		objects = append(objects, obj)
	}
	f.client = fake.NewClientset(objects...)
	cfg := DefaultConfig()
	in := &instances{cfg: &cfg, hypervisors: []Hypervisor{hv}}
	l := newLoadBalancerWith(lbConfig(t, pools), []Hypervisor{hv}, in, f.ann, nil, nil)
	f.lb = l
	// After its test, no pass of this fixture may run: the placement loop
	// outlives ctx by the pass it is in (and may start one more), and the
	// pass metrics are the process's. Taking the pass token for good waits
	// out the pass in progress and keeps any later one from starting.
	t.Cleanup(func() {
		cancel()
		select {
		case l.place.passing <- struct{}{}:
		case <-time.After(10 * time.Second):
			t.Error("a placement pass still runs 10 s after its test")
		}
	})
	return f
}

// start runs the load balancer as SetInformers does, with the
// FakeRecorder in place of the provider's recorder.
func (f *lbFixture) start() *lbFixture {
	f.t.Helper()
	factory := informers.NewSharedInformerFactory(f.client, 0)
	if err := f.lb.start(f.ctx, f.client, factory, f.rec); err != nil {
		f.t.Fatal(err)
	}
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

// drain moves recorded events into f.events and returns them all.
func (f *lbFixture) drain() []string {
	f.evMu.Lock()
	defer f.evMu.Unlock()
	for {
		select {
		case e := <-f.rec.Events:
			f.events = append(f.events, e)
		default:
			return append([]string(nil), f.events...)
		}
	}
}

// count is the number of events of this type and reason so far.
func (f *lbFixture) count(typ, reason string) int {
	n := 0
	for _, e := range f.drain() {
		if strings.HasPrefix(e, typ+" "+reason+" ") {
			n++
		}
	}
	return n
}

// waitFor polls cond (the failover loop works asynchronously).
func (f *lbFixture) waitFor(what string, cond func() bool) {
	f.t.Helper()
	err := wait.PollUntilContextTimeout(f.ctx, 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		f.t.Fatalf("%s did not happen; events: %q", what, f.drain())
	}
}

// nodeOf says which test node a MAC belongs to.
func nodeOf(mac net.HardwareAddr) (testNode, bool) {
	for _, n := range testNodes {
		if n.mac.String() == mac.String() {
			return n, true
		}
	}
	return testNode{}, false
}

func otherNode(n testNode) testNode {
	for _, o := range testNodes {
		if o.name != n.name {
			return o
		}
	}
	panic("one test node")
}

func lbService(name string, mutate ...func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: k8stypes.UID("uid-" + name)},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeLoadBalancer,
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	for _, m := range mutate {
		m(s)
	}
	return s
}

func withAnnotation(k, v string) func(*v1.Service) {
	return func(s *v1.Service) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
}

func withStatusIP(ip string) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: ip, IPMode: ptr.To(v1.LoadBalancerIPModeVIP)}}
	}
}

func withPort(p int32) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.Ports = []v1.ServicePort{{Name: fmt.Sprintf("p%d", p), Port: p, Protocol: v1.ProtocolTCP}}
	}
}

func localPolicy(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal }

// The Service is in the cache, as the service controller's are: a pass of
// the placement loop that runs before the call's own may be the one that
// announces the VIP, and it finds the Service there for its event.
func TestLoadBalancerAllocatesFromPoolAndAnnounces(t *testing.T) {
	svc := lbService("web")
	f := newLBFixture(t, "10.0.0.10-10.0.0.12", svc).start()
	vip := f.mustEnsure(svc)
	if vip != netip.MustParseAddr("10.0.0.10") {
		t.Fatalf("VIP = %s, want the pool's first address 10.0.0.10", vip)
	}
	mac := f.ann.answering(vip)
	if _, ok := nodeOf(mac); !ok {
		t.Fatalf("VIP answered by %v, want a node's NIC on the bridge", mac)
	}
	if got := len(f.ann.probes); got != 1 {
		t.Errorf("%d probes before announcing, want 1", got)
	}
	if f.count(v1.EventTypeNormal, ReasonAllocated) != 1 || f.count(v1.EventTypeNormal, ReasonVIPAnnounced) != 1 {
		t.Errorf("events = %q, want one %s and one %s", f.drain(), ReasonAllocated, ReasonVIPAnnounced)
	}

	// A second sync changes nothing and says nothing: at most it mends the
	// same answer (a keep that repairs counts as a set).
	sets := len(f.ann.setsFor(vip))
	if again := f.mustEnsure(svc); again != vip {
		t.Fatalf("second EnsureLoadBalancer moved the VIP %s -> %s", vip, again)
	}
	if len(f.ann.probes) != 1 || len(f.ann.setsFor(vip)) > sets+1 || f.ann.answering(vip).String() != mac.String() {
		t.Errorf("second sync: probes %v, sets %v; want no new probe and the same MAC", f.ann.probes, f.ann.setsFor(vip))
	}
	if events := f.drain(); len(events) != 2 {
		t.Errorf("second sync added events: %q", events)
	}
	st, exists, err := f.lb.GetLoadBalancer(f.ctx, "test", svc)
	if err != nil || !exists || len(st.Ingress) != 1 || st.Ingress[0].IP != vip.String() {
		t.Fatalf("GetLoadBalancer = %+v, %v, %v; want %s", st, exists, err, vip)
	}
	if next := f.mustEnsure(lbService("api")); next != netip.MustParseAddr("10.0.0.11") {
		t.Errorf("second Service got %s, want 10.0.0.11", next)
	}
}

// A restarted CCM loads every VIP from the Service statuses before it hands
// out any: a new Service synced first never gets an address another holds.
func TestLoadBalancerLoadsStatusesBeforeAllocating(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.13",
		lbService("old-1", withStatusIP("10.0.0.11")),
		lbService("old-2", withStatusIP("10.0.0.10")),
		lbService("foreign", withStatusIP("192.0.2.1"), func(s *v1.Service) { s.Spec.LoadBalancerClass = ptr.To("example.com/other") }),
		lbService("cluster-ip", withStatusIP("10.0.0.12"), func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeClusterIP }),
	)

	// Nothing is served before the assignments are loaded.
	early, cancel := context.WithTimeout(f.ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := f.lb.EnsureLoadBalancer(early, "test", lbService("new-0"), f.nodes); err == nil {
		t.Fatal("EnsureLoadBalancer allocated before the existing assignments were loaded")
	}
	f.start()

	st, exists, err := f.lb.GetLoadBalancer(f.ctx, "test", lbService("old-2"))
	if err != nil || !exists || st.Ingress[0].IP != "10.0.0.10" {
		t.Fatalf("GetLoadBalancer(old-2) before its first sync = %+v, %v, %v; want 10.0.0.10 from its status", st, exists, err)
	}
	// New Services first, in the order that would collide without load().
	// The ClusterIP Service's stale status does not hold 10.0.0.12.
	if got := f.mustEnsure(lbService("new-1")); got != netip.MustParseAddr("10.0.0.12") {
		t.Errorf("new-1 got %s, want 10.0.0.12 (10.0.0.10 and .11 are held by statuses)", got)
	}
	if got := f.mustEnsure(lbService("new-2")); got != netip.MustParseAddr("10.0.0.13") {
		t.Errorf("new-2 got %s, want 10.0.0.13", got)
	}
	_, err = f.ensure(lbService("new-3"))
	var exhausted *lb.PoolExhaustedError
	if !errors.As(err, &exhausted) {
		t.Errorf("new-3: err = %v, want pool exhausted", err)
	}
	if f.count(v1.EventTypeWarning, ReasonExhausted) != 1 {
		t.Errorf("events = %q, want one %s", f.drain(), ReasonExhausted)
	}
	// The loaded Services keep their addresses, without an allocation event.
	before := f.count(v1.EventTypeNormal, ReasonAllocated)
	if got := f.mustEnsure(lbService("old-1")); got != netip.MustParseAddr("10.0.0.11") {
		t.Errorf("old-1 moved to %s, want its status address 10.0.0.11", got)
	}
	if got := f.mustEnsure(lbService("old-2")); got != netip.MustParseAddr("10.0.0.10") {
		t.Errorf("old-2 moved to %s, want its status address 10.0.0.10", got)
	}
	if after := f.count(v1.EventTypeNormal, ReasonAllocated); after != before {
		t.Errorf("re-syncing loaded Services emitted %d %s events", after-before, ReasonAllocated)
	}
}

func TestLoadBalancerConflictProbe(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12").start()
	conflicts := counter(t, metrics.IPConflicts)
	vip := netip.MustParseAddr("10.0.0.10")
	rogue := net.HardwareAddr{0x02, 0xde, 0xad, 0xbe, 0xef, 0x01}
	f.ann.setForeign(vip, rogue)
	svc := lbService("web")
	for range 3 { // the service controller retries
		if _, err := f.ensure(svc); err == nil || !strings.Contains(err.Error(), rogue.String()) {
			t.Fatalf("EnsureLoadBalancer with %s owned by %s: err = %v", vip, rogue, err)
		}
	}
	if sets := f.ann.setsFor(vip); len(sets) != 0 {
		t.Fatalf("a VIP another host answers for was announced: %v", sets)
	}
	if n := f.count(v1.EventTypeWarning, ReasonConflict); n != 1 {
		t.Fatalf("%d %s events over 3 retries, want 1: %q", n, ReasonConflict, f.drain())
	}
	if f.count(v1.EventTypeNormal, ReasonVIPAnnounced) != 0 {
		t.Fatalf("conflicting VIP reported announced: %q", f.drain())
	}
	// The failover loop leaves an unprobed VIP alone.
	f.lb.place.sync(f.ctx, nil)
	if sets := f.ann.setsFor(vip); len(sets) != 0 {
		t.Fatalf("failover loop announced a conflicting VIP: %v", sets)
	}

	// The other host goes away: the next retry announces.
	f.ann.setForeign(vip, nil)
	if got := f.mustEnsure(svc); got != vip {
		t.Fatalf("after the conflict cleared: VIP %s, want %s", got, vip)
	}
	if _, ok := nodeOf(f.ann.answering(vip)); !ok {
		t.Fatalf("after the conflict cleared: answered by %v", f.ann.answering(vip))
	}

	// A node answering for the address as its own is a conflict too: the
	// VIP would split its traffic between that node and the announced one.
	next := netip.MustParseAddr("10.0.0.11")
	f.ann.setForeign(next, testNodes[1].mac)
	if _, err := f.ensure(lbService("api")); err == nil || !strings.Contains(err.Error(), testNodes[1].mac.String()) {
		t.Fatalf("%s answered by node %s was claimed: err = %v", next, testNodes[1].name, err)
	}
	if sets := f.ann.setsFor(next); len(sets) != 0 {
		t.Fatalf("a node's own address was announced as a VIP: %v", sets)
	}
	if n := conflicts(); n != 4 {
		t.Errorf("labcloud_lb_ip_conflicts_total grew by %v, want 4 (three retries, one node)", n)
	}
}

func TestLoadBalancerWarnsOncePerBadRequest(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12").start()
	bad := lbService("web", withAnnotation(lb.AnnotationIP, "10.0.0.300"))
	for range 3 {
		if _, err := f.ensure(bad); err == nil {
			t.Fatal("a malformed lb.labcloud.io/ip was accepted")
		}
	}
	if n := f.count(v1.EventTypeWarning, ReasonInvalidRequest); n != 1 {
		t.Fatalf("%d %s events for the same bad value over 3 retries, want 1: %q", n, ReasonInvalidRequest, f.drain())
	}
	// A different bad value is news.
	worse := lbService("web", withAnnotation(lb.AnnotationIP, "0.0.0.0"))
	for range 2 {
		_, _ = f.ensure(worse)
	}
	if n := f.count(v1.EventTypeWarning, ReasonInvalidRequest); n != 2 {
		t.Fatalf("%d %s events after the value changed, want 2", n, ReasonInvalidRequest)
	}
	// Outside every pool: its own reason, once.
	outside := lbService("web", withAnnotation(lb.AnnotationIP, "192.0.2.7"))
	for range 2 {
		_, _ = f.ensure(outside)
	}
	if n := f.count(v1.EventTypeWarning, ReasonNotInPool); n != 1 {
		t.Fatalf("%d %s events, want 1: %q", n, ReasonNotInPool, f.drain())
	}
	// Fixed: served; broken again later: warned again.
	if got := f.mustEnsure(lbService("web", withAnnotation(lb.AnnotationIP, "10.0.0.12"))); got != netip.MustParseAddr("10.0.0.12") {
		t.Fatalf("requested 10.0.0.12, got %s", got)
	}
	_, _ = f.ensure(bad)
	if n := f.count(v1.EventTypeWarning, ReasonInvalidRequest); n != 3 {
		t.Fatalf("%d %s events after the value broke again, want 3", n, ReasonInvalidRequest)
	}
}

// TestLoadBalancerWaitingServiceRetriesSoon: a Service waiting for an
// address gets a RetryError (the service controller requeues it after a
// short delay), and nothing writes to any Service to make it resync.
func TestLoadBalancerWaitingServiceRetriesSoon(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12",
		lbService("first"), lbService("second")).start()
	want := withAnnotation(lb.AnnotationIP, "10.0.0.11")
	first, second := lbService("first", want), lbService("second", want)
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
	if n := f.count(v1.EventTypeWarning, ReasonTaken); n != 1 {
		t.Fatalf("%d %s events, want 1: %q", n, ReasonTaken, f.drain())
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
	svc := lbService("web")
	vip := f.mustEnsure(svc)
	if err := f.lb.EnsureLoadBalancerDeleted(f.ctx, "test", svc); err != nil {
		t.Fatal(err)
	}
	if !f.ann.removed(vip) || f.ann.answering(vip) != nil {
		t.Fatalf("%s still announced after delete", vip)
	}
	st, exists, err := f.lb.GetLoadBalancer(f.ctx, "test", svc)
	if err != nil || exists {
		t.Fatalf("GetLoadBalancer after delete = %+v, %v, %v; want not found, so the finalizer goes", st, exists, err)
	}
	if f.count(v1.EventTypeNormal, ReasonReleased) != 1 {
		t.Fatalf("events = %q, want one %s", f.drain(), ReasonReleased)
	}
	// Deleting again (the finalizer retry) is harmless and silent.
	if err := f.lb.EnsureLoadBalancerDeleted(f.ctx, "test", svc); err != nil {
		t.Fatal(err)
	}
	if f.count(v1.EventTypeNormal, ReasonReleased) != 1 {
		t.Fatalf("second delete emitted another %s", ReasonReleased)
	}
	// The only address is free again, and is probed again before reuse.
	if got := f.mustEnsure(lbService("api")); got != vip {
		t.Fatalf("api got %s, want the released %s", got, vip)
	}
	if len(f.ann.probes) != 2 {
		t.Errorf("probes = %v, want the reused address probed again", f.ann.probes)
	}
}

func TestLoadBalancerSharedVIPStaysUntilLastHolder(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12").start()
	share := withAnnotation(lb.AnnotationSharingKey, "team-a")
	web, dns := lbService("web", share, withPort(80)), lbService("dns", share, withPort(53))
	vip := f.mustEnsure(web)
	if got := f.mustEnsure(dns); got != vip {
		t.Fatalf("dns got %s, want the shared %s", got, vip)
	}
	if err := f.lb.EnsureLoadBalancerDeleted(f.ctx, "test", web); err != nil {
		t.Fatal(err)
	}
	if f.ann.removed(vip) || f.ann.answering(vip) == nil {
		t.Fatalf("shared %s stopped being announced while dns still holds it", vip)
	}
	if err := f.lb.EnsureLoadBalancerDeleted(f.ctx, "test", dns); err != nil {
		t.Fatal(err)
	}
	if !f.ann.removed(vip) {
		t.Fatalf("%s still announced after its last holder was deleted", vip)
	}
}

func TestLoadBalancerFailoverOnDomainEvent(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12", lbService("web")).start()
	svc := lbService("web")
	vip := f.mustEnsure(svc)
	first, ok := nodeOf(f.ann.answering(vip))
	if !ok {
		t.Fatalf("answered by %v", f.ann.answering(vip))
	}
	other := otherNode(first)
	moves := counter(t, metrics.VIPMoves.WithLabelValues(metrics.MoveDomainDown))

	// The answering node's domain shuts off: the other node answers.
	f.hv.setState(first.name, libvirtcloud.StateShutOff)
	f.waitFor("move to "+other.name, func() bool { return f.ann.answering(vip).String() == other.mac.String() })
	f.waitFor(ReasonVIPMoved+" event", func() bool { return f.count(v1.EventTypeNormal, ReasonVIPMoved) == 1 })
	if n := moves(); n != 1 {
		t.Errorf("%v moves with reason %s, want 1", n, metrics.MoveDomainDown)
	}
	// The move is timed from the libvirt event to its first gratuitous ARP.
	f.ann.mu.Lock()
	causes := f.ann.causes
	f.ann.mu.Unlock()
	if down := f.hv.domain(first.name).DownEventAt; len(causes) != 1 || !causes[0].Equal(down) {
		t.Errorf("SetAfter causes %v, want the domain's stop event at %v", causes, down)
	}

	// The other one crashes too: nobody answers, and the Service hears it.
	f.hv.setState(other.name, libvirtcloud.StateCrashed)
	f.waitFor("VIP withdrawn", func() bool { return f.ann.answering(vip) == nil })
	f.waitFor("NoEligibleNode event", func() bool { return f.count(v1.EventTypeWarning, ReasonNoNodeForVIP) == 1 })

	// The first comes back, but its guest is still booting: its Node has
	// not reported since the domain started, so it does not answer yet.
	f.hv.setState(first.name, libvirtcloud.StateRunning)
	f.lb.place.sync(f.ctx, nil)
	if got := f.ann.answering(vip); got != nil {
		t.Fatalf("VIP handed to %v before the restarted node reported", got)
	}
	// Its kubelet reports: it answers again.
	n := first.object()
	n.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(time.Now().Add(time.Second))
	if _, err := f.client.CoreV1().Nodes().UpdateStatus(f.ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("re-announced via "+first.name, func() bool { return f.ann.answering(vip).String() == first.mac.String() })
	if n := len(f.ann.probes); n != 1 {
		t.Errorf("failover probed %d times; the address was claimed once", n)
	}
}

// A VIP whose node is gone moves, and the move says why: placement finds
// the node it leaves by the last pass's facts of its MAC, since neither the
// Node nor the domain is there to ask.
func TestLoadBalancerFailoverWhenNodeOrDomainIsGone(t *testing.T) {
	for _, tc := range []struct {
		name, reason string
		gone         func(f *lbFixture, n testNode)
	}{
		{"Node deleted", metrics.MoveNodeDeleted, func(f *lbFixture, n testNode) {
			if err := f.client.CoreV1().Nodes().Delete(f.ctx, n.name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"domain undefined", metrics.MoveDomainDown, func(f *lbFixture, n testNode) { f.hv.undefine(n.name) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newLBFixture(t, "10.0.0.10-10.0.0.12", lbService("web")).start()
			vip := f.mustEnsure(lbService("web"))
			first, ok := nodeOf(f.ann.answering(vip))
			if !ok {
				t.Fatalf("answered by %v", f.ann.answering(vip))
			}
			other := otherNode(first)
			moves := counter(t, metrics.VIPMoves.WithLabelValues(tc.reason))

			tc.gone(f, first)
			f.waitFor("move to "+other.name, func() bool { return f.ann.answering(vip).String() == other.mac.String() })
			if n := moves(); n != 1 {
				t.Errorf("%v moves with reason %s, want 1", n, tc.reason)
			}
			f.waitFor(ReasonVIPMoved+" event", func() bool { return f.count(v1.EventTypeNormal, ReasonVIPMoved) == 1 })
			want := fmt.Sprintf("%s moved from node %s to node %s", vip, first.name, other.name)
			if ev := f.drain(); !slices.ContainsFunc(ev, func(e string) bool { return strings.Contains(e, want) }) {
				t.Errorf("events %q, want one saying %q", ev, want)
			}
		})
	}
}

func TestLoadBalancerFailoverOnNodeNotReady(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12", lbService("web")).start()
	vip := f.mustEnsure(lbService("web"))
	first, _ := nodeOf(f.ann.answering(vip))
	other := otherNode(first)

	notReady := counter(t, metrics.VIPMoves.WithLabelValues(metrics.MoveNodeNotReady))
	rebalance := counter(t, metrics.VIPMoves.WithLabelValues(metrics.MoveRebalance))

	n := first.object()
	n.Status.Conditions[0].Status = v1.ConditionFalse
	if _, err := f.client.CoreV1().Nodes().UpdateStatus(f.ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("move off the NotReady node", func() bool { return f.ann.answering(vip).String() == other.mac.String() })
	if n := notReady(); n != 1 {
		t.Errorf("%v moves with reason %s, want 1", n, metrics.MoveNodeNotReady)
	}

	// Back to Ready: the VIP goes back to the node the placement function
	// gives it, as any replica or a restarted CCM would compute.
	n.Status.Conditions[0].Status = v1.ConditionTrue
	if _, err := f.client.CoreV1().Nodes().UpdateStatus(f.ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("back on "+first.name, func() bool { return f.ann.answering(vip).String() == first.mac.String() })
	if n := rebalance(); n != 1 {
		t.Errorf("%v moves with reason %s, want 1", n, metrics.MoveRebalance)
	}
	f.ann.mu.Lock()
	defer f.ann.mu.Unlock()
	if len(f.ann.causes) != 0 {
		t.Errorf("moves not caused by libvirt events were timed: %v", f.ann.causes)
	}
}

func endpointSlice(svc string, ready map[string]bool) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svc + "-abc", Namespace: "default",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	i := 0
	for node, r := range ready {
		i++
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.244.0.%d", i)},
			NodeName:   ptr.To(node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(r)},
		})
	}
	return es
}

func TestLoadBalancerLocalPolicyUsesNodesWithReadyEndpoints(t *testing.T) {
	for _, n := range testNodes {
		t.Run("endpoint on "+n.name, func(t *testing.T) {
			other := otherNode(n)
			f := newLBFixture(t, "10.0.0.10-10.0.0.12", lbService("web", localPolicy),
				endpointSlice("web", map[string]bool{n.name: true, other.name: false}))
			f.lb.place.localDamping = time.Millisecond // TestLocalPolicyDampsEndpointFlaps tests it
			f.start()
			vip := f.mustEnsure(lbService("web", localPolicy))
			if got := f.ann.answering(vip); got.String() != n.mac.String() {
				t.Fatalf("answered by %v, want %s, the only node with a ready endpoint", got, n.name)
			}
			moves := counter(t, metrics.VIPMoves.WithLabelValues(metrics.MoveEndpoints))

			// The endpoint moves: so does the VIP, without a service sync.
			moved := endpointSlice("web", map[string]bool{n.name: false, other.name: true})
			if _, err := f.client.DiscoveryV1().EndpointSlices("default").Update(f.ctx, moved, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			f.waitFor("follow the endpoint to "+other.name, func() bool { return f.ann.answering(vip).String() == other.mac.String() })
			if n := moves(); n != 1 {
				t.Errorf("%v moves with reason %s, want 1", n, metrics.MoveEndpoints)
			}

			// No ready endpoint anywhere: nobody answers.
			none := endpointSlice("web", map[string]bool{n.name: false, other.name: false})
			if _, err := f.client.DiscoveryV1().EndpointSlices("default").Update(f.ctx, none, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			f.waitFor("VIP withdrawn", func() bool { return f.ann.answering(vip) == nil })
		})
	}

	// Cluster policy ignores endpoints.
	f := newLBFixture(t, "10.0.0.10-10.0.0.12", lbService("web"),
		endpointSlice("web", map[string]bool{testNodes[0].name: false, testNodes[1].name: false})).start()
	vip := f.mustEnsure(lbService("web"))
	if _, ok := nodeOf(f.ann.answering(vip)); !ok {
		t.Fatalf("Cluster policy: answered by %v, want any node", f.ann.answering(vip))
	}
}

func TestLoadBalancerSkipsNodesOffTheBridge(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12")
	// node-b's domain has no NIC on the bridge.
	f.hv.mu.Lock()
	d := f.hv.doms[testNodes[1].uuid]
	d.Interfaces = d.Interfaces[:1]
	f.hv.doms[testNodes[1].uuid] = d
	f.hv.mu.Unlock()
	f.start()
	for i := range 3 {
		vip := f.mustEnsure(lbService(fmt.Sprintf("svc-%d", i)))
		if got := f.ann.answering(vip); got.String() != testNodes[0].mac.String() {
			t.Fatalf("%s answered by %v, want node-a's bridge NIC %s", vip, got, testNodes[0].mac)
		}
	}
}

// setReady sets a test Node's Ready condition as kube-controller-manager
// (Unknown, NodeStatusUnknown) or a kubelet (True, False) reports it, the
// status having changed at changed.
func (f *lbFixture) setReady(n testNode, status v1.ConditionStatus, changed time.Time) {
	f.t.Helper()
	obj := n.object()
	c := &obj.Status.Conditions[0]
	c.Status, c.LastTransitionTime = status, metav1.NewTime(changed)
	if status == v1.ConditionUnknown {
		c.Reason = "NodeStatusUnknown"
	}
	if _, err := f.client.CoreV1().Nodes().UpdateStatus(f.ctx, obj, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// TestVIPStaysWhileEveryNodeIsUnknown: after a control-plane outage
// kube-controller-manager marks every Node Unknown until the kubelets
// report again. Their domains run, so the VIP stays where it is instead of
// going dark; a Node that reports Ready takes it, and a Node its kubelet
// reports NotReady gives it up.
func TestVIPStaysWhileEveryNodeIsUnknown(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12", lbService("web")).start()
	vip := f.mustEnsure(lbService("web"))
	first, _ := nodeOf(f.ann.answering(vip))
	other := otherNode(first)

	// Unknown for longer than the hold: only a Ready node would take it.
	long := time.Now().Add(-2 * UnknownHold)
	f.setReady(other, v1.ConditionUnknown, long)
	f.setReady(first, v1.ConditionUnknown, long)
	time.Sleep(100 * time.Millisecond) // the loop's passes on both updates
	f.lb.place.sync(f.ctx, nil)
	if f.ann.removed(vip) || f.ann.answering(vip).String() != first.mac.String() {
		t.Fatalf("with every Node Unknown the VIP went from %s to %v (removed: %v); events %q",
			first.mac, f.ann.answering(vip), f.ann.removed(vip), f.drain())
	}

	f.setReady(other, v1.ConditionTrue, time.Now())
	f.waitFor("move to the Node that reported Ready", func() bool { return f.ann.answering(vip).String() == other.mac.String() })

	f.setReady(first, v1.ConditionUnknown, long)
	f.setReady(other, v1.ConditionFalse, time.Now())
	f.waitFor("withdrawn from the Node its kubelet reports NotReady", func() bool { return f.ann.removed(vip) && f.ann.answering(vip) == nil })
}

// TestUnknownNodeKeepsVIPsForTheHold: the kubelets report again one by one
// after a control-plane outage. The first node back Ready does not take the
// VIPs of nodes that went Unknown less than UnknownHold ago; once their
// hold is over, a pass (with no other change to start it) moves them.
func TestUnknownNodeKeepsVIPsForTheHold(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12", lbService("web")).start()
	vip := f.mustEnsure(lbService("web"))
	first, _ := nodeOf(f.ann.answering(vip))
	other := otherNode(first)

	f.setReady(first, v1.ConditionUnknown, time.Now())
	f.setReady(other, v1.ConditionTrue, time.Now())
	time.Sleep(100 * time.Millisecond) // the loop's passes on both updates
	f.lb.place.sync(f.ctx, nil)
	if got := f.ann.answering(vip); got.String() != first.mac.String() {
		t.Fatalf("the VIP left the node Unknown for 0 s of the %v hold: answered by %v, want %s; events %q", UnknownHold, got, first.mac, f.drain())
	}

	// The hold ends 1 s from now (room for a loaded machine to make the
	// check below first); nothing else changes after this.
	f.setReady(first, v1.ConditionUnknown, time.Now().Add(time.Second-UnknownHold))
	time.Sleep(100 * time.Millisecond)
	if got := f.ann.answering(vip); got.String() != first.mac.String() {
		t.Fatalf("the VIP left before its hold ended: answered by %v, want %s", got, first.mac)
	}
	f.waitFor("move to the Ready node once the hold is over", func() bool { return f.ann.answering(vip).String() == other.mac.String() })
}

// lbConfig is the defaults with a load balancer of pools on testBridge, as
// loading resolves it.
func lbConfig(t *testing.T, pools []lb.PoolConfig) *Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.LoadBalancer = LoadBalancerConfig{Bridge: testBridge, Pools: pools}
	cfg = resolvedOf(t, cfg)
	return &cfg
}
