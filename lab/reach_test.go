package lab

import (
	"reflect"
	"testing"
)

func TestUplinkPlan(t *testing.T) {
	prefixes := func(o Options) []string {
		var out []string
		for _, n := range uplinkPlan(o).Prefixes {
			out = append(out, n.What+" "+n.Prefix.String())
		}
		return out
	}
	for _, tc := range []struct {
		name string
		opts Options
		want []string
	}{
		{"one host, IPv4", Options{Hosts: 1}, []string{"network 10.123.0.0/24", "pod CIDRs 10.244.0.0/16"}},
		{"dual stack", Options{Hosts: 1, IPFamily: DualStack}, []string{"network 10.123.0.0/24", "pod CIDRs 10.244.0.0/16",
			"IPv6 network fd00:10:123::/64", "IPv6 pod CIDRs fd00:10:244::/56"}},
		{"IPv6: no IPv4 pods", Options{Hosts: 1, IPFamily: IPv6}, []string{"network 10.123.0.0/24",
			"IPv6 network fd00:10:123::/64", "IPv6 pod CIDRs fd00:10:244::/56"}},
		{"routed: every host's network, the LAN, the VIPs", Options{Hosts: 2, Routed: true}, []string{
			"network of host 1 10.123.0.0/24", "network of host 2 10.123.2.0/24", "LAN 10.123.250.0/24",
			"VIP pool 10.123.240.0/26", "pod CIDRs 10.244.0.0/16"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := prefixes(tc.opts); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("uplinkPlan:\n got %q\nwant %q", got, tc.want)
			}
			if got := uplinkPlan(tc.opts).IPv6; got != tc.opts.IPFamily.HasIPv6() {
				t.Errorf("IPv6 %t, want %t", got, !got)
			}
		})
	}
}
