package provider

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/labcloud/labcloud/lb"
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

	if got := f.mustEnsure(lbService("a1", inNamespace("team-a"), withAnnotation(lb.AnnotationPool, "team-a"))); got != netip.MustParseAddr("10.0.0.20") {
		t.Errorf("team-a/a1 asked for its pool and got %s", got)
	}
	if got := f.mustEnsure(lbService("g1", inNamespace("gold-team"), withAnnotation(lb.AnnotationPool, "gold"))); got != netip.MustParseAddr("10.0.0.30") {
		t.Errorf("gold-team/g1 (labelled tier=gold) asked for the gold pool and got %s", got)
	}
	for _, svc := range []*v1.Service{
		lbService("b1", inNamespace("team-b"), withAnnotation(lb.AnnotationPool, "team-a")),
		lbService("b2", inNamespace("team-b"), withAnnotation(lb.AnnotationIP, "10.0.0.25")),
		lbService("b3", inNamespace("team-b"), withAnnotation(lb.AnnotationPool, "gold")),
	} {
		for range 3 {
			st, err := f.ensure(svc)
			if !errors.Is(err, lb.ErrPoolNotForNamespace) || st != nil {
				t.Fatalf("team-b/%s: %v, %v; want no address and the pool refused", svc.Name, st, err)
			}
		}
	}
	var warnings []string
	for _, e := range f.drain() {
		if strings.HasPrefix(e, v1.EventTypeWarning+" "+ReasonNotForNS+" ") {
			warnings = append(warnings, e)
		}
	}
	if len(warnings) != 3 || !strings.Contains(warnings[0], `pool "team-a"`) || !strings.Contains(warnings[2], `pool "gold"`) {
		t.Errorf("want one %s Warning per Service naming its pool, got %q", ReasonNotForNS, warnings)
	}
	if got := f.mustEnsure(lbService("b4", inNamespace("team-b"))); got != netip.MustParseAddr("10.0.0.10") {
		t.Errorf("team-b/b4 without a pool got %s, want the open pool's first", got)
	}
}
