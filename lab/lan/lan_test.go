package lan

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestPlan(t *testing.T) {
	p := New(netip.MustParsePrefix("10.123.0.0/24"))
	if p.Subnet(1) != "10.123.0" || p.Subnet(3) != "10.123.3" {
		t.Errorf("subnets %s, %s; want the lab's for the first host, 10.123.K for host K", p.Subnet(1), p.Subnet(3))
	}
	if p.Uplink(2) != "10.123.250.2" {
		t.Errorf("host 2's uplink %s", p.Uplink(2))
	}
	routes := p.RouterRoutes(2)
	want := [][]string{{"route", "replace", "10.123.0.0/24", "via", "10.123.250.1"}, {"route", "replace", "10.123.2.0/24", "via", "10.123.250.2"}}
	if !slices.EqualFunc(routes, want, slices.Equal) {
		t.Errorf("router routes %q, want %q", routes, want)
	}
	var joined []string
	for _, c := range p.HostCommands(2, "lcrt0", "lcbr0", "10.244.0.0/16") {
		joined = append(joined, strings.Join(c, " "))
	}
	for _, w := range []string{"ip addr add 10.123.250.2/24 dev lcrt0", "ip route replace 10.244.0.0/16 via 10.123.250.254", "iptables -I FORWARD 1 -o lcbr0 -j ACCEPT"} {
		if !slices.Contains(joined, w) {
			t.Errorf("host commands %q lack %q", joined, w)
		}
	}
	// The VIPs lie on no host's subnet but inside what hosts send to the router.
	if strings.HasPrefix(p.VIPPool(), "10.123.0.") || !strings.HasPrefix(p.VIPPool(), "10.123.") {
		t.Errorf("VIP pool %s", p.VIPPool())
	}
}

// A moved lab (up --subnet) moves every segment with it, into its /16.
func TestPlanMoved(t *testing.T) {
	p := New(netip.MustParsePrefix("10.77.5.0/24"))
	got := []string{p.Subnet(1), p.Subnet(3), p.Uplink(2), p.RouterAddr(), p.VIPPool(), p.viaRouter()}
	want := []string{"10.77.5", "10.77.3", "10.77.250.2", "10.77.250.254", "10.77.240.1-10.77.240.62", "10.77.0.0/16"}
	if !slices.Equal(got, want) {
		t.Errorf("moved plan %q, want %q", got, want)
	}
}
