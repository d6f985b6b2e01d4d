package placement

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/netroutes"
	"github.com/labcloud/labcloud/provider/internal/follow"
	"github.com/labcloud/labcloud/provider/internal/lbtest"
)

// owns is the VIPs a fake announcer answers, by the node answering.
func owns(a *lbtest.Announcer) map[string]int {
	out := map[string]int{}
	for _, mac := range a.Answering() {
		n, _ := lbtest.NodeOf(mac)
		out[n.Name]++
	}
	return out
}

// TestEachHostAnswersForItsOwnNodes: with node-a on the leader's host and
// node-b on another, the leader's announcer answers only the VIPs placed
// on node-a, and the other host's replica, following the Services'
// Announced conditions, only those on node-b; a VIP that moves between
// hosts leaves one announcer for the other.
func TestEachHostAnswersForItsOwnNodes(t *testing.T) {
	f := newFixtureHere(t, "10.0.0.0/27", map[string]bool{"zone-a": true, "zone-b": false})
	b := f.hv.Domain("node-b")
	b.Hypervisor = "zone-b"
	f.hv.Put(b)
	f.start()

	// The second host's replica: its own announcer, following.
	leftover := &recordedPaths{}
	other := followOn(t, f, "zone-b", leftover)

	const services = 8
	for i := range services {
		svc, err := f.client.CoreV1().Services("default").Create(f.ctx, lbtest.Service(fmt.Sprintf("svc-%d", i)), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The ingress, as the service controller writes it.
		ingress := fmt.Sprintf(`{"status":{"loadBalancer":{"ingress":[{"ip":%q}]}}}`, f.mustEnsure(svc))
		if _, err := f.client.CoreV1().Services("default").Patch(f.ctx, svc.Name, types.MergePatchType, []byte(ingress), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
	}
	onA, onB := 0, 0
	for vip, mac := range f.p.answers.answering() {
		if n, _ := lbtest.NodeOf(mac); n.Name == "node-a" {
			onA++
		} else {
			onB++
			if _, owned := f.ann.Owned(vip); owned {
				t.Errorf("the leader's announcer answers %s, placed on node-b on the other host", vip)
			}
		}
	}
	if onA == 0 || onB == 0 || onA+onB != services {
		t.Fatalf("placed %d VIPs on node-a and %d on node-b, want %d over both", onA, onB, services)
	}
	// The routes to VIPs an earlier leader left on the follower's host go.
	f.WaitFor("the follower removing its host's routes to VIPs", func() bool {
		leftover.mu.Lock()
		defer leftover.mu.Unlock()
		return len(leftover.calls) == 1 && leftover.calls[0] == "reconcile 0"
	})
	f.WaitFor("each host answering its own node's VIPs", func() bool {
		a, b := owns(f.ann), owns(other)
		return a["node-a"] == onA && len(a) == 1 && b["node-b"] == onB && len(b) == 1
	})

	// node-a's domain crashes: its VIPs move to node-b, so to the other host.
	f.hv.SetState("node-a", libvirtcloud.StateCrashed)
	f.WaitFor("every VIP answered by the other host", func() bool {
		return len(f.ann.Answering()) == 0 && owns(other)["node-b"] == services
	})
	if n := len(f.p.answers.answering()); n != services {
		t.Errorf("the leader knows %d answers, want %d", n, services)
	}
}

// TestNewLeaderKeepsOtherHostsAnswers: a replica that starts leading takes
// the answers the conditions give to other hosts as they are, so it does
// not announce them afresh.
func TestNewLeaderKeepsOtherHostsAnswers(t *testing.T) {
	remote := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x0b}
	vip := netip.MustParseAddr("10.0.0.9")
	svc := lbtest.Service("kept", lbtest.WithStatusIP(vip.String()))
	svc.Status.Conditions = []metav1.Condition{lb.AnnouncedCondition([]lb.Answer{{VIP: vip, Node: "node-b", MAC: remote}})}
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if err := indexer.Add(svc); err != nil {
		t.Fatal(err)
	}
	ann := lbtest.NewAnnouncer()
	s := newAnswerer(ann, map[string]bool{"zone-a": true})
	s.lead()
	claims := map[netip.Addr]vipClaim{vip: {services: []string{"default/kept"}}, netip.MustParseAddr("10.0.0.10"): {services: []string{"default/none"}}}
	s.seed(corelisters.NewServiceLister(indexer), claims)
	if got := s.answering(); len(got) != 1 || got[vip].String() != remote.String() {
		t.Fatalf("answers after seeding %v, want %s by %s only", got, vip, remote)
	}
	// Kept where it is: not set on this host's announcer.
	if err := s.keep(vip, remote, "zone-b", true); err != nil {
		t.Fatal(err)
	}
	if len(ann.Sets()) != 0 {
		t.Errorf("this host's announcer was set %v for a VIP answered on another host", ann.Sets())
	}
	// Its domain migrated here: now this host answers it.
	if err := s.keep(vip, remote, "zone-a", false); err != nil {
		t.Fatal(err)
	}
	if mac, ok := ann.Owned(vip); !ok || mac.String() != remote.String() || len(s.elsewhere) != 0 {
		t.Errorf("after the domain came to this host: owned %v %v, elsewhere %v", mac, ok, s.elsewhere)
	}
	if err := s.remove(vip); err != nil || len(s.answering()) != 0 {
		t.Errorf("after remove: %v, answers %v", err, s.answering())
	}
}

// recordedPaths records what is asked of the host's routes to VIPs.
type recordedPaths struct {
	mu    sync.Mutex
	calls []string // "reconcile N" / "update N": N routes desired
}

func (r *recordedPaths) Subnets() ([]netip.Prefix, error) { return nil, nil }
func (r *recordedPaths) ReconcilePaths(p []netroutes.Paths) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, fmt.Sprintf("reconcile %d", len(p)))
	return 0, nil
}
func (r *recordedPaths) UpdatePaths(p []netroutes.Paths) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, fmt.Sprintf("update %d", len(p)))
	return 0, nil
}

// conditionClaims believes every claim of the Services' Announced
// conditions: which claims to believe is provider's to judge, and tested
// there.
type conditionClaims struct{ services coreinformers.ServiceInformer }

// OnChange's handler goes with the test's informers.
func (c conditionClaims) OnChange(f func()) (func(), error) {
	_, err := follow.OnAnyChange(c.services.Informer(), f)
	return func() {}, err
}

func (c conditionClaims) WaitSynced(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), c.services.Informer().HasSynced)
}

func (c conditionClaims) Answers(_ context.Context, mine func(lb.Answer) bool) (map[netip.Addr]lb.Answer, bool, error) {
	all, err := c.services.Lister().List(labels.Everything())
	out := map[netip.Addr]lb.Answer{}
	for _, svc := range all {
		for _, a := range AnnouncedAnswers(svc) {
			if a.MAC != nil && mine(a) {
				out[a.VIP] = a
			}
		}
	}
	return out, false, err
}

// followOn starts, beside f's leader, the replica of another host whose
// hypervisor zone it is, following the conditions with its own announcer
// (returned); vipRoutes are its host's routes to VIPs.
func followOn(t *testing.T, f *fixture, zone string, vipRoutes PathSetter) *lbtest.Announcer {
	t.Helper()
	ann := lbtest.NewAnnouncer()
	p := New(Config{Bridge: lbtest.Bridge, Hypervisors: []Hypervisor{f.hv}, Domain: f.domain, Announcer: ann, VIPRoutes: vipRoutes})
	factory := informers.NewSharedInformerFactory(f.client, 0)
	if err := p.Follow(f.ctx, conditionClaims{factory.Core().V1().Services()}, []HostHypervisor{{Domains: f.hv.InZone(zone), Bridge: lbtest.Bridge}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.follower.Halt)
	factory.Start(f.ctx.Done())
	return ann
}

// countedClaims counts the follower's reads of its claims, and sees it
// end (it removes its handler).
type countedClaims struct {
	conditionClaims
	mu    sync.Mutex
	reads int
	ended bool
}

func (c *countedClaims) OnChange(f func()) (func(), error) {
	remove, err := c.conditionClaims.OnChange(f)
	return func() {
		remove()
		c.mu.Lock()
		c.ended = true
		c.mu.Unlock()
	}, err
}

func (c *countedClaims) Answers(ctx context.Context, mine func(lb.Answer) bool) (map[netip.Addr]lb.Answer, bool, error) {
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	return c.conditionClaims.Answers(ctx, mine)
}

// done says whether the follower has read twice or ended.
func (c *countedClaims) done() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads >= 2 || c.ended
}

// TestFollowerNeverWritesBesideTheLeader: the announcer has one writer.
// Once this replica leads, a follower answers nothing, even one started
// after Lead, whatever the conditions say.
func TestFollowerNeverWritesBesideTheLeader(t *testing.T) {
	vip, b := netip.MustParseAddr("10.0.0.11"), testNodes[1]
	claimed := lbtest.Service("web", lbtest.WithStatusIP(vip.String()))
	claimed.Status.Conditions = []metav1.Condition{lb.AnnouncedCondition([]lb.Answer{{VIP: vip, Node: b.Name, MAC: b.MAC}})}
	f := newFixture(t, "10.0.0.10-10.0.0.12", claimed)
	p := f.placementOnly() // leads; no VIP is held, so no pass sets one

	factory := informers.NewSharedInformerFactory(f.client, 0)
	claims := &countedClaims{conditionClaims: conditionClaims{factory.Core().V1().Services()}}
	if err := p.Follow(f.ctx, claims, []HostHypervisor{{Domains: f.hv.InZone(lbtest.Zone), Bridge: lbtest.Bridge}}); err != nil {
		t.Fatal(err)
	}
	factory.Start(f.ctx.Done())
	f.WaitFor("two reads of the conditions by the follower, or its end", claims.done)
	if sets := f.ann.Sets(); len(sets) != 0 {
		t.Errorf("a follower started after Lead answered %q beside the leader", sets)
	}
}

// TestAnswererWritesInOneModeAtATime: until lead only the follower's
// writes land; from lead on only the leader's.
func TestAnswererWritesInOneModeAtATime(t *testing.T) {
	ann := lbtest.NewAnnouncer()
	s := newAnswerer(ann, nil)
	ctx := context.Background()
	first, second := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	a, b := testNodes[0].MAC, testNodes[1].MAC

	if err := s.set(second, b, lbtest.Zone, time.Time{}); !errors.Is(err, errNotLeading) {
		t.Errorf("a leader's set while following: %v, want errNotLeading", err)
	}
	s.answerOnly(ctx, map[netip.Addr]net.HardwareAddr{first: a})
	if err := s.remove(first); !errors.Is(err, errNotLeading) {
		t.Errorf("a leader's remove while following: %v, want errNotLeading", err)
	}
	if got := ann.Sets(); len(got) != 1 || got[0] != first.String()+" "+a.String() || ann.Removed(first) {
		t.Fatalf("while following: sets %q, %s removed %v; want the follower's answer alone", got, first, ann.Removed(first))
	}

	s.lead()
	s.answerOnly(ctx, map[netip.Addr]net.HardwareAddr{})
	if ann.Removed(first) || ann.MAC(first).String() != a.String() {
		t.Errorf("a follower's write after lead removed %s", first)
	}
	if err := s.set(second, b, lbtest.Zone, time.Time{}); err != nil || ann.MAC(second).String() != b.String() {
		t.Errorf("the leader's set: %v, %s answered by %v", err, second, ann.MAC(second))
	}
}
