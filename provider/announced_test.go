package provider

import (
	"context"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/provider/internal/lbtest"
	"github.com/labcloud/labcloud/provider/placement"
)

// trustPools: one pool for every namespace, one kept for namespace a.
var trustPools = []lb.PoolConfig{
	{Name: "shared", Addresses: []string{"10.0.0.0/28", "fd00::/124"}},
	{Name: "tenant-a", Addresses: []string{"10.0.1.0/28"}, Namespaces: []string{"a"}},
}

// claiming is a LoadBalancer Service of namespace ns whose ingress lists
// ingress and whose Announced condition claims answers.
func claiming(ns, name string, ingress []string, answers ...lb.Answer) *v1.Service {
	s := lbtest.Service(name)
	s.Namespace = ns
	for _, ip := range ingress {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
	}
	s.Status.Conditions = []metav1.Condition{lb.AnnouncedCondition(answers)}
	return s
}

// TestFollowerAnswersOnlyWhatTheLeaderCouldHave: a following replica,
// whose host runs node-a and node-b, reads forged conditions: Service b/forge
// claims a/web's VIP for node-b though its ingress does not list it;
// b/steal lists and claims a VIP of the pool kept for namespace a; b/s1 and
// b/s2, which both list one VIP, claim it for different nodes. None of
// them moves or takes a VIP, and the conflicting VIP does not flip between
// the two from pass to pass: nobody answers it.
func TestFollowerAnswersOnlyWhatTheLeaderCouldHave(t *testing.T) {
	f := newLBFixtureOf(t, trustPools)
	a, b := testNodes[0], testNodes[1]
	ip := netip.MustParseAddr
	claim := func(vip string, n lbtest.Node) lb.Answer { return lb.Answer{VIP: ip(vip), Node: n.Name, MAC: n.MAC} }
	for _, svc := range []*v1.Service{
		claiming("a", "web", []string{"10.0.0.1"}, claim("10.0.0.1", a)),
		claiming("a", "ok", []string{"10.0.0.3"}, claim("10.0.0.3", b)),
		claiming("b", "forge", []string{"10.0.0.9"}, claim("10.0.0.1", b)),
		claiming("b", "steal", []string{"10.0.1.1"}, claim("10.0.1.1", b)),
		claiming("b", "s1", []string{"10.0.0.4"}, claim("10.0.0.4", a)),
		claiming("b", "s2", []string{"10.0.0.4"}, claim("10.0.0.4", b)),
	} {
		if _, err := f.client.CoreV1().Services(svc.Namespace).Create(f.ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Told at the first pass; the reporter's own test times the grace.
	ann := followOn(t, f, trustPools, "zone-a", 0)

	// Three passes at least (one every placement.FollowPeriod).
	time.Sleep(3*placement.FollowPeriod + placement.FollowPeriod/2)
	sets := ann.Sets()
	answering := map[string]string{}
	for vip, mac := range ann.Answering() {
		answering[vip.String()] = mac.String()
	}
	want := map[string]string{"10.0.0.1": a.MAC.String(), "10.0.0.3": b.MAC.String()}
	if len(answering) != len(want) || answering["10.0.0.1"] != want["10.0.0.1"] || answering["10.0.0.3"] != want["10.0.0.3"] {
		t.Errorf("the follower answers %v, want %v", answering, want)
	}
	for _, forbidden := range []string{"10.0.0.1 " + b.MAC.String(), "10.0.1.1 " + b.MAC.String(), "10.0.0.4 " + a.MAC.String(), "10.0.0.4 " + b.MAC.String()} {
		if slices.Contains(sets, forbidden) {
			t.Errorf("the follower answered %s, as a forged or conflicting condition says (answers set: %q)", forbidden, sets)
		}
	}
	// Each refused claim is told once, on its Service, naming the VIP and
	// why, however many passes saw it.
	for _, tc := range []struct{ name, msg string }{
		{"forge", "claims 10.0.0.1 for node node-b (52:54:00:00:00:0b); not believed: not in the Service's status.loadBalancer.ingress"},
		{"steal", `claims 10.0.1.1 for node node-b (52:54:00:00:00:0b); not believed: pool "tenant-a" is kept for other namespaces than b`},
		{"s1", "claims 10.0.0.4 for node node-a (52:54:00:00:00:0a); not believed: Service b/s2 claims it for node node-b (52:54:00:00:00:0b)"},
		{"s2", "claims 10.0.0.4 for node node-b (52:54:00:00:00:0b); not believed: Service b/s1 claims it for node node-a (52:54:00:00:00:0a)"},
	} {
		e := waitObjectEvent(t, f.client, "Service", "b", tc.name, EventClaimRefused, tc.msg)
		if e.Type != v1.EventTypeWarning || e.Count != 1 {
			t.Errorf("event on b/%s: %s, count %d; want a Warning, told once", tc.name, e.Type, e.Count)
		}
	}
	evs, err := f.client.CoreV1().Events("").List(f.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) != 4 {
		t.Errorf("%d events, want the 4 refusals only", len(evs.Items))
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
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, s := range services {
		if err := indexer.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	r := &claimReader{services: corelisters.NewServiceLister(indexer), rules: claimRules{serves: LoadBalancerConfig{}.Serves, pools: pools}, report: newClaimReporter(nil, 0)}
	// What the follower asks: the answers of a MAC of a domain on its host.
	answers, _, err := r.Answers(context.Background(), func(a lb.Answer) bool { return a.MAC.String() == local.String() })
	if err != nil {
		t.Fatal(err)
	}
	got := map[netip.Addr]net.HardwareAddr{}
	for vip, a := range answers {
		got[vip] = a.MAC
	}
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

// TestTrustedAnswers: which claims of the Announced conditions a replica
// believes, and why it refuses the others, in any order of the cache.
func TestTrustedAnswers(t *testing.T) {
	pools, err := lb.NewPools(append(slices.Clone(trustPools), lb.PoolConfig{Name: "team-x", Addresses: []string{"10.0.2.0/28"},
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "x"}}}))
	if err != nil {
		t.Fatal(err)
	}
	namespaces := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for name, team := range map[string]string{"x1": "x", "y1": "y"} {
		if err := namespaces.Add(&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"team": team}}}); err != nil {
			t.Fatal(err)
		}
	}
	rules := claimRules{serves: LoadBalancerConfig{}.Serves, pools: pools, namespaces: corelisters.NewNamespaceLister(namespaces)}
	ip := netip.MustParseAddr
	m1, m2 := testMAC("1"), testMAC("2")
	on := func(vip, node string, mac net.HardwareAddr) lb.Answer {
		return lb.Answer{VIP: ip(vip), Node: node, MAC: mac}
	}
	classed := claiming("a", "classed", []string{"10.0.0.8"}, on("10.0.0.8", "n1", m1))
	classed.Spec.LoadBalancerClass = ptr.To("example.com/other")
	services := []*v1.Service{
		claiming("a", "web", []string{"10.0.0.1"}, on("10.0.0.1", "n1", m1)),
		claiming("b", "forge", []string{"10.0.0.9"}, on("10.0.0.1", "n2", m2)),                                  // a's VIP, not in its ingress
		claiming("b", "forge-ingress", []string{"10.0.0.9"}, on("10.0.0.9", "n2", m2), on("fd00::2", "n2", m2)), // one claim of two is its own
		claiming("a", "tenant", []string{"10.0.1.1"}, on("10.0.1.1", "n1", m1)),
		claiming("b", "steal", []string{"10.0.1.2"}, on("10.0.1.2", "n2", m2)),
		claiming("x1", "team", []string{"10.0.2.1"}, on("10.0.2.1", "n1", m1)),
		claiming("y1", "team", []string{"10.0.2.2"}, on("10.0.2.2", "n1", m1)),
		claiming("z1", "team", []string{"10.0.2.3"}, on("10.0.2.3", "n1", m1)), // no such namespace in the cache
		claiming("b", "share-1", []string{"10.0.0.5"}, on("10.0.0.5", "n1", m1)),
		claiming("b", "share-2", []string{"10.0.0.5"}, on("10.0.0.5", "n2", m2)),
		claiming("b", "share-3", []string{"10.0.0.5"}, on("10.0.0.5", "n1", m1)),
		claiming("b", "agree-1", []string{"10.0.0.6"}, on("10.0.0.6", "n1", m1)),
		claiming("b", "agree-2", []string{"10.0.0.6"}, on("10.0.0.6", "n1", m1)),
		claiming("b", "outside", []string{"192.0.2.1"}, on("192.0.2.1", "n1", m1)),
		claiming("b", "nobody", []string{"10.0.0.7"}, lb.Answer{VIP: ip("10.0.0.7")}),
		classed,
	}
	want := map[string]string{"10.0.0.1": "n1", "10.0.0.9": "n2", "10.0.1.1": "n1", "10.0.2.1": "n1", "10.0.0.6": "n1"}
	wantRefused := []string{
		"b/forge 10.0.0.1: not in the Service's status.loadBalancer.ingress",
		"b/forge-ingress fd00::2: not in the Service's status.loadBalancer.ingress",
		`b/steal 10.0.1.2: pool "tenant-a" is kept for other namespaces than b`,
		`y1/team 10.0.2.2: pool "team-x" is kept for other namespaces than y1`,
		`z1/team 10.0.2.3: pool "team-x" is kept for other namespaces than z1`,
		"b/outside 192.0.2.1: in no loadBalancer pool",
		"b/share-1 10.0.0.5: Service b/share-2 claims it for node n2 (" + m2.String() + "): answered by neither until the claims agree",
		"b/share-2 10.0.0.5: Service b/share-1 claims it for node n1 (" + m1.String() + "): answered by neither until the claims agree",
		"b/share-3 10.0.0.5: Service b/share-2 claims it for node n2 (" + m2.String() + "): answered by neither until the claims agree",
	}
	slices.Sort(wantRefused)
	for round := range 5 {
		order := slices.Clone(services)
		if round > 0 {
			rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		answers, refused := trustedAnswers(order, rules)
		got := map[string]string{}
		for vip, a := range answers {
			got[vip.String()] = a.Node
		}
		if !maps.Equal(got, want) {
			t.Errorf("order %d: answers %v, want %v", round, got, want)
		}
		var gotRefused []string
		for _, r := range refused {
			gotRefused = append(gotRefused, key(r.svc)+" "+r.answer.VIP.String()+": "+r.why)
		}
		slices.Sort(gotRefused)
		if !slices.Equal(gotRefused, wantRefused) {
			t.Errorf("order %d: refused\n%s\nwant\n%s", round, strings.Join(gotRefused, "\n"), strings.Join(wantRefused, "\n"))
		}
	}
}

// TestClaimReporterTellsOnceAfterGrace: a refusal is told once it has
// lasted the grace, once while it lasts, and again only after it ended
// and came back.
func TestClaimReporterTellsOnceAfterGrace(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	r := newClaimReporter(rec, claimGrace)
	forged := refusedClaim{svc: claiming("b", "forge", nil), answer: lb.Answer{VIP: netip.MustParseAddr("10.0.0.1"), Node: "n2", MAC: testMAC("2")}, why: "not in the Service's status.loadBalancer.ingress"}
	other := forged
	other.answer.VIP = netip.MustParseAddr("10.0.0.2")
	t0 := time.Now()
	ctx := context.Background()
	for _, step := range []struct {
		at      time.Duration
		refused []refusedClaim
		told    int
		pending bool
	}{
		{0, []refusedClaim{forged}, 0, true},
		{claimGrace - time.Second, []refusedClaim{forged, other}, 0, true},
		{claimGrace, []refusedClaim{forged, other}, 1, true},
		{claimGrace + time.Hour, []refusedClaim{forged, other}, 1, false}, // other's grace is over too
		{claimGrace + 2*time.Hour, []refusedClaim{forged, other}, 0, false},
		{claimGrace + 3*time.Hour, nil, 0, false},                   // both mended
		{claimGrace + 4*time.Hour, []refusedClaim{forged}, 0, true}, // forged again: a new grace
		{2*claimGrace + 4*time.Hour, []refusedClaim{forged}, 1, false},
	} {
		pending := r.note(ctx, step.refused, t0.Add(step.at))
		told := len(rec.Events)
		for range told {
			if e := <-rec.Events; !strings.HasPrefix(e, "Warning "+EventClaimRefused+" ") || !strings.Contains(e, "claims 10.0.0.") {
				t.Errorf("at %s: event %q", step.at, e)
			}
		}
		if told != step.told || pending != step.pending {
			t.Errorf("at %s: told %d, pending %v; want %d, %v", step.at, told, pending, step.told, step.pending)
		}
	}
}

// followOn starts, beside f's leader, the replica of another host whose
// hypervisor zone it is, following the conditions with pools and its own
// announcer (returned). Refused claims are told after grace.
func followOn(t *testing.T, f *lbFixture, pools []lb.PoolConfig, zone string, grace time.Duration) *lbtest.Announcer {
	t.Helper()
	cfg := lbConfig(t, pools)
	ann := lbtest.NewAnnouncer()
	follower := newLoadBalancerWith(cfg, []Hypervisor{f.hv}, f.in, ann, nil, nil)
	factory := informers.NewSharedInformerFactory(f.client, 0)
	src := newAnnouncedSource(f.ctx, factory, f.client, LoadBalancerConfig{}.Serves, cfg.ParsedPools())
	src.grace = grace
	// It follows until f's context ends.
	if err := follower.place.Follow(f.ctx, src.reader(), []placement.HostHypervisor{{Domains: f.hv.InZone(zone), Bridge: lbtest.Bridge}}); err != nil {
		t.Fatal(err)
	}
	factory.Start(f.ctx.Done())
	return ann
}
