package provider

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/netroutes"
	"github.com/labcloud/labcloud/provider/internal/lbtest"
)

// hostOfZone is the fake hypervisor's domains in one zone: one host's
// hypervisor, as a following replica sees its own.
type hostOfZone struct {
	h    *lbtest.Hypervisor
	zone string
}

func (z hostOfZone) Subscribe() (<-chan libvirtcloud.Event, func()) { return z.h.Subscribe() }
func (z hostOfZone) WaitSynced(context.Context) error               { return nil }
func (z hostOfZone) Domains() []libvirtcloud.Domain {
	var out []libvirtcloud.Domain
	for _, d := range z.h.Domains() {
		if d.Hypervisor == z.zone {
			out = append(out, d)
		}
	}
	return out
}

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
	f := newLBFixture(t, "10.0.0.0/27")
	b := f.hv.Domain("node-b")
	b.Hypervisor = "zone-b"
	f.hv.Put(b)
	f.lb.place.answers.here = map[string]bool{"zone-a": true, "zone-b": false}
	f.start()

	// The second host's replica: its own announcer, following.
	leftover := &recordedPaths{}
	other := followOn(t, f, []lb.PoolConfig{{Name: "test", Addresses: []string{"10.0.0.0/27"}}}, "zone-b", leftover, claimGrace)

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
	for vip, mac := range f.lb.place.answers.answering() {
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
	f.waitFor("the follower removing its host's routes to VIPs", func() bool {
		leftover.mu.Lock()
		defer leftover.mu.Unlock()
		return len(leftover.calls) == 1 && leftover.calls[0] == "reconcile 0"
	})
	f.waitFor("each host answering its own node's VIPs", func() bool {
		a, b := owns(f.ann), owns(other)
		return a["node-a"] == onA && len(a) == 1 && b["node-b"] == onB && len(b) == 1
	})

	// node-a's domain crashes: its VIPs move to node-b, so to the other host.
	f.hv.SetState("node-a", libvirtcloud.StateCrashed)
	f.waitFor("every VIP answered by the other host", func() bool {
		return len(f.ann.Answering()) == 0 && owns(other)["node-b"] == services
	})
	if n := len(f.lb.place.answers.answering()); n != services {
		t.Errorf("the leader knows %d answers, want %d", n, services)
	}
}

// TestHostAnswersFollowTheConditions: a following replica answers a VIP
// when the Announced condition names a MAC of a domain on its host, of a
// Service this CCM serves, whose ingress lists the VIP, in its pools;
// nothing else.
func TestHostAnswersFollowTheConditions(t *testing.T) {
	local := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}
	remote := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 2}
	announced := func(name string, answers ...lb.Answer) *v1.Service {
		var ingress []string
		for _, a := range answers {
			ingress = append(ingress, a.VIP.String())
		}
		return claiming("default", name, ingress, answers...)
	}
	ip := netip.MustParseAddr
	classed := announced("classed", lb.Answer{VIP: ip("10.0.0.5"), Node: "n1", MAC: local})
	classed.Spec.LoadBalancerClass = ptr.To("example.com/other")
	notLB := announced("cluster-ip", lb.Answer{VIP: ip("10.0.0.6"), Node: "n1", MAC: local})
	notLB.Spec.Type = v1.ServiceTypeClusterIP
	garbled := lbtest.Service("garbled")
	garbled.Status.Conditions = []metav1.Condition{{Type: lb.ConditionAnnounced, Status: metav1.ConditionTrue, Message: "nonsense"}}
	services := []*v1.Service{
		announced("here", lb.Answer{VIP: ip("10.0.0.1"), Node: "n1", MAC: local}),
		announced("dual", lb.Answer{VIP: ip("10.0.0.2"), Node: "n1", MAC: local}, lb.Answer{VIP: ip("fd00::2"), Node: "n1", MAC: local}),
		announced("there", lb.Answer{VIP: ip("10.0.0.3"), Node: "n2", MAC: remote}),
		announced("nobody", lb.Answer{VIP: ip("10.0.0.4")}),
		announced("outside-pools", lb.Answer{VIP: ip("192.0.2.1"), Node: "n1", MAC: local}),
		classed, notLB, garbled, lbtest.Service("unplaced"),
	}
	pools, err := lb.NewPools([]lb.PoolConfig{{Name: "test", Addresses: []string{"10.0.0.0/24", "fd00::/120"}}})
	if err != nil {
		t.Fatal(err)
	}
	answers, _ := trustedAnswers(services, claimRules{serves: LoadBalancerConfig{}.Serves, pools: pools})
	k, _ := keyOf(local)
	got := hostAnswers(answers, map[macKey]bool{k: true})
	want := map[netip.Addr]string{ip("10.0.0.1"): local.String(), ip("10.0.0.2"): local.String(), ip("fd00::2"): local.String()}
	if len(got) != len(want) {
		t.Errorf("answers %v, want %v", got, want)
	}
	for vip, mac := range want {
		if got[vip].String() != mac {
			t.Errorf("%s answered by %v, want %s", vip, got[vip], mac)
		}
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
	s := newAnswerSplit(ann, map[string]bool{"zone-a": true})
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
