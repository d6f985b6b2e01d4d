package lan

import (
	"slices"
	"strings"
	"testing"
)

func TestPlan(t *testing.T) {
	if Subnet(1, "10.123.0") != "10.123.0" || Subnet(3, "10.123.0") != "10.123.3" {
		t.Errorf("subnets %s, %s; want the lab's for the first host, 10.123.K for host K", Subnet(1, "10.123.0"), Subnet(3, "10.123.0"))
	}
	if Uplink(2) != "10.123.250.2" {
		t.Errorf("host 2's uplink %s", Uplink(2))
	}
	routes := RouterRoutes(2, "10.123.0")
	want := [][]string{{"route", "replace", "10.123.0.0/24", "via", "10.123.250.1"}, {"route", "replace", "10.123.2.0/24", "via", "10.123.250.2"}}
	if !slices.EqualFunc(routes, want, slices.Equal) {
		t.Errorf("router routes %q, want %q", routes, want)
	}
	var joined []string
	for _, c := range HostCommands(2, "lcrt0", "lcbr0", "10.244.0.0/16") {
		joined = append(joined, strings.Join(c, " "))
	}
	for _, w := range []string{"ip addr add 10.123.250.2/24 dev lcrt0", "ip route replace 10.244.0.0/16 via 10.123.250.254", "iptables -I FORWARD 1 -o lcbr0 -j ACCEPT"} {
		if !slices.Contains(joined, w) {
			t.Errorf("host commands %q lack %q", joined, w)
		}
	}
	// The VIPs lie on no host's subnet but inside what hosts send to the router.
	if strings.HasPrefix(VIPPool, "10.123.0.") || !strings.HasPrefix(VIPPool, "10.123.") {
		t.Errorf("VIP pool %s", VIPPool)
	}
}
