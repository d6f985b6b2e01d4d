package placement

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/provider/internal/follow"
	"github.com/labcloud/labcloud/provider/internal/lbtest"
)

// TestMain registers labcloud's metrics before any test runs (lbtest.Main).
func TestMain(m *testing.M) { lbtest.Main(m) }

var (
	_ Announcer           = (*lbtest.Announcer)(nil)
	_ Hypervisor          = (*lbtest.Hypervisor)(nil)
	_ follow.DomainEvents = (*lbtest.Hypervisor)(nil)
	_ connectivity        = (*lbtest.Hypervisor)(nil)
	_ HostDomains         = lbtest.ZoneHost{}
)

var testNodes = lbtest.Nodes()

// fixture is a placement over fakes: the two test Nodes' domains on one
// hypervisor, an announcer, and a cluster holding the Nodes. Its ensure
// and release do around placement what the provider's load balancer does.
type fixture struct {
	lbtest.Cluster
	t      *testing.T
	ctx    context.Context
	p      *Placement
	alloc  *lb.Allocator
	ann    *lbtest.Announcer
	hv     *lbtest.Hypervisor
	client *fake.Clientset
	events *lbtest.Events
}

// newFixture builds placement over pool, with the given objects (Services,
// EndpointSlices) already in the cluster besides the two Nodes; the caller
// starts it.
func newFixture(t *testing.T, pool string, objects ...runtime.Object) *fixture {
	t.Helper()
	return newFixtureHere(t, pool, nil, objects...)
}

// newFixtureHere is newFixture with here as Config.Here.
func newFixtureHere(t *testing.T, pool string, here map[string]bool, objects ...runtime.Object) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := &fixture{t: t, ctx: ctx, ann: lbtest.NewAnnouncer(), hv: lbtest.NewHypervisor(testNodes), events: lbtest.NewEvents()}
	for _, n := range testNodes {
		objects = append(objects, n.Object())
	}
	f.client = fake.NewClientset(objects...)
	f.Cluster = lbtest.NewCluster(t, ctx, f.client, f.events)
	pools, err := lb.NewPools([]lb.PoolConfig{{Name: "test", Addresses: []string{pool}}})
	if err != nil {
		t.Fatal(err)
	}
	f.alloc = lb.NewAllocator(pools)
	f.p = New(Config{Bridge: lbtest.Bridge, Hypervisors: []Hypervisor{f.hv}, Domain: f.domain, Alloc: f.alloc, Announcer: f.ann, Here: here})
	// After its test, no pass of this fixture may run: the placement loop
	// outlives ctx by the pass it is in (and may start one more), and the
	// pass metrics are the process's. Taking the pass token for good waits
	// out the pass in progress and keeps any later one from starting.
	t.Cleanup(func() {
		cancel()
		select {
		case f.p.passing <- struct{}{}:
		case <-time.After(10 * time.Second):
			t.Error("a placement pass still runs 10 s after its test")
		}
	})
	return f
}

// domain finds a test Node's domain by its providerID, as the provider
// does first.
func (f *fixture) domain(_ context.Context, n *v1.Node) (libvirtcloud.Domain, error) {
	return f.hv.DomainByUUID(strings.TrimPrefix(n.Spec.ProviderID, "libvirt://"))
}

// start leads and runs placement as the provider's load balancer does,
// with the FakeRecorder in place of the provider's recorder.
func (f *fixture) start() *fixture {
	f.t.Helper()
	f.placementOnly()
	go f.p.Run(f.ctx)
	return f
}

// placementOnly leads, starting placement's informers and nothing else:
// no loop, so passes run only when the test asks for them.
func (f *fixture) placementOnly() *Placement {
	f.t.Helper()
	factory := informers.NewSharedInformerFactory(f.client, 0)
	if err := f.p.Lead(f.ctx, factory, f.events.Recorder, f.client); err != nil {
		f.t.Fatal(err)
	}
	factory.Start(f.ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(f.ctx.Done()) {
		if !ok {
			f.t.Fatalf("informer for %v did not sync", typ)
		}
	}
	return f.p
}

// ensure does what EnsureLoadBalancer does around placement: it allocates
// the Service's VIPs, claims them, and returns after a pass has placed
// them.
func (f *fixture) ensure(svc *v1.Service) []netip.Addr {
	f.t.Helper()
	req, err := lb.ParseRequest(svc)
	if err != nil {
		f.t.Fatal(err)
	}
	res, err := f.alloc.Allocate(key(svc), req)
	if err != nil {
		f.t.Fatalf("allocate for %s: %v", svc.Name, err)
	}
	for _, ip := range res.IPs {
		f.alloc.Claim(ip)
	}
	f.p.Sync(f.ctx, svc)
	return res.IPs
}

// mustEnsure returns the Service's one VIP.
func (f *fixture) mustEnsure(svc *v1.Service) netip.Addr {
	f.t.Helper()
	ips := f.ensure(svc)
	if len(ips) != 1 {
		f.t.Fatalf("%s got %v, want one VIP", svc.Name, ips)
	}
	return ips[0]
}

// release does what EnsureLoadBalancerDeleted does around placement.
func (f *fixture) release(svc *v1.Service) {
	f.alloc.Release(key(svc))
	f.p.Sync(f.ctx, nil)
}
