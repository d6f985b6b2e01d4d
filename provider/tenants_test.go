package provider

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cloud-provider/api"
	"k8s.io/utils/ptr"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/provider/internal/lbtest"
)

func inNamespace(ns string) func(*v1.Service) {
	return func(s *v1.Service) { s.Namespace = ns }
}

// TestPoolsKeptForNamespaces: a pool kept for some namespaces (by name or
// by label) serves them; a Service elsewhere that asks for it gets one
// Warning naming the pool, and no address.
func TestPoolsKeptForNamespaces(t *testing.T) {
	gold := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gold-team", Labels: map[string]string{"tier": "gold"}}}
	f := newLBFixtureOf(t, []lb.PoolConfig{
		{Name: "open", Addresses: []string{"10.0.0.10-10.0.0.19"}},
		{Name: "team-a", Addresses: []string{"10.0.0.20-10.0.0.29"}, Namespaces: []string{"team-a"}},
		{Name: "gold", Addresses: []string{"10.0.0.30-10.0.0.39"},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}}},
	}, gold).start()

	if got := f.mustEnsure(lbtest.Service("a1", inNamespace("team-a"), lbtest.WithAnnotation(lb.AnnotationPool, "team-a"))); got != netip.MustParseAddr("10.0.0.20") {
		t.Errorf("team-a/a1 asked for its pool and got %s", got)
	}
	if got := f.mustEnsure(lbtest.Service("g1", inNamespace("gold-team"), lbtest.WithAnnotation(lb.AnnotationPool, "gold"))); got != netip.MustParseAddr("10.0.0.30") {
		t.Errorf("gold-team/g1 (labelled tier=gold) asked for the gold pool and got %s", got)
	}
	for _, svc := range []*v1.Service{
		lbtest.Service("b1", inNamespace("team-b"), lbtest.WithAnnotation(lb.AnnotationPool, "team-a")),
		lbtest.Service("b2", inNamespace("team-b"), lbtest.WithAnnotation(lb.AnnotationIP, "10.0.0.25")),
		lbtest.Service("b3", inNamespace("team-b"), lbtest.WithAnnotation(lb.AnnotationPool, "gold")),
	} {
		for range 3 {
			st, err := f.ensure(svc)
			if !errors.Is(err, lb.ErrPoolNotForNamespace) || st != nil {
				t.Fatalf("team-b/%s: %v, %v; want no address and the pool refused", svc.Name, st, err)
			}
		}
	}
	var warnings []string
	for _, e := range f.Drain() {
		if strings.HasPrefix(e, v1.EventTypeWarning+" "+ReasonNotForNS+" ") {
			warnings = append(warnings, e)
		}
	}
	if len(warnings) != 3 || !strings.Contains(warnings[0], `pool "team-a"`) || !strings.Contains(warnings[2], `pool "gold"`) {
		t.Errorf("want one %s Warning per Service naming its pool, got %q", ReasonNotForNS, warnings)
	}
	if got := f.mustEnsure(lbtest.Service("b4", inNamespace("team-b"))); got != netip.MustParseAddr("10.0.0.10") {
		t.Errorf("team-b/b4 without a pool got %s, want the open pool's first", got)
	}
}

// TestRequireDualStackWholeOrNotAtAll: a RequireDualStack Service gets a
// VIP of each family, both answered by one node; where no pool has IPv6 it
// gets one Warning naming the family and no address of any family (the
// IPv4 VIP is never announced alone), while an IPv4 Service beside it is
// served.
func TestRequireDualStackWholeOrNotAtAll(t *testing.T) {
	dual := lbtest.Service("dual", func(s *v1.Service) {
		s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
		s.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicyRequireDualStack)
	})

	f := newLBFixtureOf(t, []lb.PoolConfig{{Name: "both", Addresses: []string{"10.0.0.10-10.0.0.19", "fd00::10-fd00::19"}}}).start()
	st, err := f.ensure(dual)
	if err != nil || len(st.Ingress) != 2 || st.Ingress[0].IP != "10.0.0.10" || st.Ingress[1].IP != "fd00::10" {
		t.Fatalf("dual-stack Service: %+v, %v; want 10.0.0.10 and fd00::10", st, err)
	}
	v4, v6 := f.ann.MAC(netip.MustParseAddr("10.0.0.10")), f.ann.MAC(netip.MustParseAddr("fd00::10"))
	if v4 == nil || v4.String() != v6.String() {
		t.Errorf("IPv4 VIP answered by %v, IPv6 VIP by %v; want one node", v4, v6)
	}

	g := newLBFixtureOf(t, []lb.PoolConfig{{Name: "v4", Addresses: []string{"10.0.0.10-10.0.0.19"}}}).start()
	for range 3 {
		if st, err := g.ensure(dual); !errors.Is(err, lb.ErrNoPoolForFamily) || st != nil {
			t.Fatalf("dual-stack Service without an IPv6 pool: %v, %v; want refused", st, err)
		}
	}
	if ips := g.lb.alloc.Lookup("default/dual"); len(ips) > 0 {
		t.Errorf("the refused dual-stack Service holds %v", ips)
	}
	if n := g.Count(v1.EventTypeWarning, ReasonNoPoolForFamily); n != 1 {
		t.Errorf("%d %s Warnings over 3 tries, want 1", n, ReasonNoPoolForFamily)
	}
	if got := g.mustEnsure(lbtest.Service("v4")); got != netip.MustParseAddr("10.0.0.10") {
		t.Errorf("IPv4 Service got %s", got)
	}
	if answering := g.ann.Answering(); len(answering) > 1 {
		t.Errorf("announced %v; want only the IPv4 Service's VIP", answering)
	}
}

// TestWaitingServiceBacksOff: a Service waiting for a taken address is
// retried after 3 s, then twice as long each time up to 2 min; a changed
// request starts again at 3 s, and so does a Service served in between.
func TestWaitingServiceBacksOff(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12").start()
	f.mustEnsure(lbtest.Service("holder", lbtest.WithAnnotation(lb.AnnotationIP, "10.0.0.11")))
	waiter := lbtest.Service("waiter", lbtest.WithAnnotation(lb.AnnotationIP, "10.0.0.11"))
	retryAfter := func(svc *v1.Service) time.Duration {
		t.Helper()
		_, err := f.ensure(svc)
		var re *api.RetryError
		if !errors.As(err, &re) {
			t.Fatalf("%s: %v, want a RetryError", svc.Name, err)
		}
		return re.RetryAfter()
	}
	var got []time.Duration
	for range 8 {
		got = append(got, retryAfter(waiter))
	}
	want := []time.Duration{3 * time.Second, 6 * time.Second, 12 * time.Second, 24 * time.Second, 48 * time.Second, 96 * time.Second, 2 * time.Minute, 2 * time.Minute}
	if !slices.Equal(got, want) {
		t.Errorf("waits %v, want %v", got, want)
	}
	changed := lbtest.Service("waiter", lbtest.WithAnnotation(lb.AnnotationIP, "10.0.0.11"), lbtest.WithAnnotation(lb.AnnotationSharingKey, "k"))
	if d := retryAfter(changed); d != waitRetry {
		t.Errorf("after the request changed: wait %s, want %s", d, waitRetry)
	}
	if d := retryAfter(changed); d != 2*waitRetry {
		t.Errorf("second wait of the changed request: %s, want %s", d, 2*waitRetry)
	}
}

// TestUnmendableRequestWaitsForAChange: a request only a change of the
// Service can mend (a 100 kB malformed annotation, a family no pool has) is
// retried after maxWaitRetry, with a short error and one Warning.
func TestUnmendableRequestWaitsForAChange(t *testing.T) {
	f := newLBFixture(t, "10.0.0.10-10.0.0.12").start()
	for _, svc := range []*v1.Service{
		lbtest.Service("junk", lbtest.WithAnnotation(lb.AnnotationIP, strings.Repeat("x", 100_000))),
		lbtest.Service("v6", func(s *v1.Service) { s.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol} }),
	} {
		for range 3 {
			_, err := f.ensure(svc)
			var re *api.RetryError
			if !errors.As(err, &re) || re.RetryAfter() != maxWaitRetry || len(err.Error()) > 1024 {
				t.Fatalf("%s: %.200v; want a RetryError after %s, under 1 kB", svc.Name, err, maxWaitRetry)
			}
		}
	}
	if n, m := f.Count(v1.EventTypeWarning, ReasonInvalidRequest), f.Count(v1.EventTypeWarning, ReasonNoPoolForFamily); n != 1 || m != 1 {
		t.Errorf("%d %s and %d %s Warnings over 3 tries each, want 1 and 1", n, ReasonInvalidRequest, m, ReasonNoPoolForFamily)
	}
}
