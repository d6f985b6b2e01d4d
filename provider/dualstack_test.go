package provider

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/provider/internal/lbtest"
)

func dualStack(policy v1.IPFamilyPolicy) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
		s.Spec.IPFamilyPolicy = ptr.To(policy)
	}
}

// ingressIPs are the addresses of a status, in order.
func ingressIPs(st *v1.LoadBalancerStatus) []string {
	var out []string
	for _, ing := range st.Ingress {
		out = append(out, ing.IP)
	}
	return out
}

// TestPreferDualStackSaysWhatIsMissing: a PreferDualStack Service whose
// IPv6 pool is exhausted is served on IPv4, with one DualStackPartial event
// over several syncs that names the family and why; once an IPv6 address
// is freed it gets one too, and a later shortfall is told again.
func TestPreferDualStackSaysWhatIsMissing(t *testing.T) {
	f := newLBFixtureOf(t, []lb.PoolConfig{
		{Name: "v4", Addresses: []string{"10.0.0.10-10.0.0.19"}},
		{Name: "v6", Addresses: []string{"fd00::10"}},
	}).start()
	v6only := lbtest.Service("v6only", func(s *v1.Service) { s.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol} })
	if got := f.mustEnsure(v6only); got != netip.MustParseAddr("fd00::10") {
		t.Fatalf("IPv6 Service got %s", got)
	}
	prefer := lbtest.Service("prefer", dualStack(v1.IPFamilyPolicyPreferDualStack))
	for range 3 {
		st, err := f.ensure(prefer)
		if err != nil || !slices.Equal(ingressIPs(st), []string{"10.0.0.10"}) {
			t.Fatalf("PreferDualStack with IPv6 exhausted: %v, %v; want 10.0.0.10", st, err)
		}
	}
	partial := func() []string {
		var out []string
		for _, e := range f.Drain() {
			if strings.HasPrefix(e, v1.EventTypeNormal+" "+ReasonDualStackPartial+" ") {
				out = append(out, e)
			}
		}
		return out
	}
	if got := partial(); len(got) != 1 || !strings.Contains(got[0], "no IPv6 address") || !strings.Contains(got[0], "no free IPv6 address") {
		t.Fatalf("want one %s event naming IPv6 and why, got %q", ReasonDualStackPartial, got)
	}

	if err := f.lb.EnsureLoadBalancerDeleted(f.ctx, "test", v6only); err != nil {
		t.Fatal(err)
	}
	st, err := f.ensure(prefer)
	if err != nil || !slices.Equal(ingressIPs(st), []string{"10.0.0.10", "fd00::10"}) {
		t.Fatalf("after IPv6 was freed: %v, %v; want both", st, err)
	}
	if got := partial(); len(got) != 1 {
		t.Errorf("served whole, yet %d %s events", len(got), ReasonDualStackPartial)
	}
	// Another Service hits the same shortfall and is told so.
	if _, err := f.ensure(lbtest.Service("prefer2", dualStack(v1.IPFamilyPolicyPreferDualStack))); err != nil {
		t.Fatal(err)
	}
	if got := partial(); len(got) != 2 || !strings.Contains(got[1], "10.0.0.11") {
		t.Errorf("want a second %s event for the second Service, got %q", ReasonDualStackPartial, got)
	}
}

// TestDualStackVIPsAnsweredTogether: each dual-stack Service's two VIPs are
// answered by one node, and move together when it goes down.
func TestDualStackVIPsAnsweredTogether(t *testing.T) {
	f := newLBFixtureOf(t, []lb.PoolConfig{{Name: "both", Addresses: []string{"10.0.0.0/27", "fd00::/123"}}}).start()
	var pairs [][2]netip.Addr
	for i := range 12 {
		st, err := f.ensure(lbtest.Service(fmt.Sprintf("svc-%d", i), dualStack(v1.IPFamilyPolicyRequireDualStack)))
		if err != nil || len(st.Ingress) != 2 {
			t.Fatalf("svc-%d: %v, %v", i, st, err)
		}
		pairs = append(pairs, [2]netip.Addr{netip.MustParseAddr(st.Ingress[0].IP), netip.MustParseAddr(st.Ingress[1].IP)})
	}
	together := func() bool {
		for _, p := range pairs {
			if a, b := f.ann.MAC(p[0]), f.ann.MAC(p[1]); a == nil || a.String() != b.String() {
				return false
			}
		}
		return true
	}
	if !together() {
		t.Fatalf("VIP pairs %v answered apart: %v", pairs, f.ann.Answering())
	}
	first, _ := lbtest.NodeOf(f.ann.MAC(pairs[0][0]))
	f.SetReady(first, v1.ConditionFalse, time.Now())
	other := lbtest.OtherNode(first)
	f.WaitFor("both VIPs moved to "+other.Name, func() bool {
		return together() && f.ann.MAC(pairs[0][1]).String() == other.MAC.String()
	})
}
