package provider

import (
	"strings"
	"testing"

	"github.com/labcloud/labcloud/lb"
)

// Withdraw removes what the CCM owns on the host and nothing else: its
// pod-CIDR and VIP routes (by protocol) and the permanent neighbour
// entries of pool addresses on the bridge.
func TestWithdrawLeavesOnlyWhatIsNotOwned(t *testing.T) {
	l := newRtLab(t)
	for _, args := range [][]string{
		{"route", "add", "10.244.1.0/24", "via", "192.168.77.11", "dev", "rtbr0", "proto", "76", "metric", "3076"},
		{"route", "add", "192.168.77.200/32", "via", "192.168.77.11", "dev", "rtbr0", "proto", "77", "metric", "3076"},
		{"route", "add", "10.245.0.0/24", "via", "192.168.77.12", "dev", "rtbr0", "proto", "static"},
		{"neigh", "add", "192.168.77.200", "lladdr", "52:54:00:00:00:11", "dev", "rtbr0", "nud", "permanent"},
		{"neigh", "add", "192.168.77.5", "lladdr", "52:54:00:00:00:12", "dev", "rtbr0", "nud", "permanent"},
	} {
		l.ip(t, args...)
	}
	cfg := resolvedOf(t, Config{
		Routes:       RoutesConfig{Bridge: "rtbr0"},
		LoadBalancer: LoadBalancerConfig{Bridge: "rtbr0", Pools: []lb.PoolConfig{{Name: "p", Addresses: []string{"192.168.77.200-192.168.77.210"}}}},
	})
	var got Withdrawn
	var err error
	l.inNetns(t, func() { got, err = Withdraw(cfg) })
	if err != nil {
		t.Fatal(err)
	}
	if got != (Withdrawn{Routes: 1, VIPRoutes: 1, Neighbours: 1}) {
		t.Errorf("withdrew %+v, want one of each", got)
	}
	routes := l.show(t)
	if strings.Contains(routes, "proto 76") || strings.Contains(routes, "proto 77") || !strings.Contains(routes, "10.245.0.0/24") {
		t.Errorf("routes after Withdraw:\n%s\nwant the owned ones gone and the foreign one kept", routes)
	}
	neigh := l.ip(t, "neigh", "show", "dev", "rtbr0")
	if strings.Contains(neigh, "192.168.77.200 ") || !strings.Contains(neigh, "192.168.77.5 ") {
		t.Errorf("neighbours after Withdraw:\n%s\nwant the pool's gone and the other kept", neigh)
	}
	// Again: nothing left, and a missing bridge holds nothing.
	l.inNetns(t, func() {
		got, err = Withdraw(cfg)
		if err == nil {
			cfg.Routes.Bridge, cfg.LoadBalancer.Bridge = "gone0", "gone0"
			_, err = Withdraw(cfg)
		}
	})
	if err != nil || got != (Withdrawn{}) {
		t.Errorf("second Withdraw = %+v, %v; want nothing and no error", got, err)
	}
}
