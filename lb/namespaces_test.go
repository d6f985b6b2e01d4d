package lb

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPoolsPerNamespace(t *testing.T) {
	a := NewAllocator(mustPools(t,
		PoolConfig{Name: "open", Addresses: []string{"10.0.0.0/31"}},
		PoolConfig{Name: "team-a", Addresses: []string{"10.0.1.0/30"}, Namespaces: []string{"team-a", "team-c"}},
		PoolConfig{Name: "gold", Addresses: []string{"10.0.2.0/30"},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}}},
	))
	gold := map[string]string{"tier": "gold"}
	for _, tc := range []struct {
		key    string
		req    Request
		want   string // the address, or "" for an error
		wantNS string // the namespace a PoolNotForNamespaceError names
	}{
		{"team-b/asks-pool", Request{Pool: "team-a"}, "", "team-b"},
		{"team-b/asks-ip", Request{IPs: addrs("10.0.1.2")}, "", "team-b"},
		{"team-a/asks-pool", Request{Pool: "team-a"}, "10.0.1.0", ""},
		{"team-c/asks-ip", Request{IPs: addrs("10.0.1.2")}, "10.0.1.2", ""},
		{"team-a/any", Request{}, "10.0.0.0", ""}, // configuration order
		{"team-b/any", Request{}, "10.0.0.1", ""},
		{"team-b/any2", Request{}, "", ""}, // open is full; team-a and gold are not team-b's
		{"silver/gold", Request{Pool: "gold"}, "", "silver"},
		{"gold/gold", Request{Pool: "gold", NamespaceLabels: gold}, "10.0.2.0", ""},
		{"gold/any", Request{NamespaceLabels: gold}, "10.0.2.1", ""},
	} {
		ips, err := ipsOf(a.Allocate(tc.key, tc.req))
		var nf *PoolNotForNamespaceError
		switch {
		case tc.want != "" && (err != nil || len(ips) != 1 || ips[0] != netip.MustParseAddr(tc.want)):
			t.Errorf("%s: got %v, %v; want %s", tc.key, ips, err, tc.want)
		case tc.want == "" && err == nil:
			t.Errorf("%s: got %v; want an error", tc.key, ips)
		case tc.wantNS != "" && (!errors.As(err, &nf) || nf.Namespace != tc.wantNS || !errors.Is(err, ErrPoolNotForNamespace)):
			t.Errorf("%s: %v; want the pool named as kept for other namespaces than %s", tc.key, err, tc.wantNS)
		case tc.want == "" && tc.wantNS == "" && !errors.Is(err, ErrPoolExhausted):
			t.Errorf("%s: %v; want exhausted", tc.key, err)
		}
	}
}

func TestPoolNamespaceConfigErrors(t *testing.T) {
	for _, cfg := range []PoolConfig{
		{Name: "p", Addresses: []string{"10.0.0.0/30"}, Namespaces: []string{"Team_A"}},
		{Name: "p", Addresses: []string{"10.0.0.0/30"}, Namespaces: []string{strings.Repeat("a", 300)}},
		{Name: "p", Addresses: []string{"10.0.0.0/30"}, NamespaceSelector: &metav1.LabelSelector{}},
		{Name: "p", Addresses: []string{"10.0.0.0/30"}, NamespaceSelector: &metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: "Near"}}}},
	} {
		_, err := NewPool(cfg)
		if err == nil || !strings.HasPrefix(err.Error(), `pool "p": namespace`) || len(err.Error()) > 512 {
			t.Errorf("%+v: %v; want a short error naming the pool and the field", cfg, err)
		}
	}
	ps := mustPools(t, PoolConfig{Name: "p", Addresses: []string{"10.0.0.0/30"}, Namespaces: []string{"a"}})
	if ps.SelectsNamespaces() {
		t.Error("SelectsNamespaces without a selector")
	}
	p, _ := ps.Pool("p")
	if !p.Restricted() || !p.Serves("a", nil) || p.Serves("b", nil) {
		t.Errorf("namespaces [a]: restricted %v, serves a %v, b %v", p.Restricted(), p.Serves("a", nil), p.Serves("b", nil))
	}
}
