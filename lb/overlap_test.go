package lb

import (
	"net/netip"
	"testing"
)

func TestPoolOverlap(t *testing.T) {
	p, err := NewPool(PoolConfig{Name: "lab", Addresses: []string{"10.0.0.200-10.0.0.250", "10.0.1.0/28", "fd00::/120"}})
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr
	for _, tt := range []struct {
		first, last string
		spec        string
	}{
		{"10.0.0.2", "10.0.0.254", "10.0.0.200-10.0.0.250"},
		{"10.0.0.250", "10.0.0.250", "10.0.0.200-10.0.0.250"},
		{"10.0.0.2", "10.0.0.199", ""},
		{"10.0.0.251", "10.0.0.254", ""},
		{"10.0.1.1", "10.0.1.1", "10.0.1.0/28"},
		{"10.0.1.16", "10.0.1.100", ""},
		{"fd00::ff", "fd00::1ff", "fd00::/120"},
		{"::ffff:10.0.0.1", "::ffff:10.0.0.255", ""}, // another family's numbers
	} {
		spec, ok := p.Overlap(a(tt.first), a(tt.last))
		if spec != tt.spec || ok != (tt.spec != "") {
			t.Errorf("Overlap(%s, %s) = %q, %v; want %q", tt.first, tt.last, spec, ok, tt.spec)
		}
	}
}
