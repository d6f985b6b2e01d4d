package lab

import (
	"reflect"
	"strings"
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

func TestHostResolvers(t *testing.T) {
	const resolved = "nameserver 192.0.2.53\nnameserver 2001:db8::53\nsearch example.org\n"
	for _, tc := range []struct {
		name               string
		conf, resolvedConf string
		want               []string
	}{
		{"plain resolv.conf", "# generated\nsearch lan\nnameserver 192.0.2.1\nnameserver 198.51.100.1 # second\n", resolved, []string{"192.0.2.1", "198.51.100.1"}},
		{"systemd-resolved's stub: its upstreams", "nameserver 127.0.0.53\noptions edns0 trust-ad\n", resolved, []string{"192.0.2.53"}},
		{"loopback ones are left out", "nameserver 127.0.0.1\nnameserver 192.0.2.1\n", resolved, []string{"192.0.2.1"}},
		{"IPv6 only: unreachable from the lab", "nameserver 2001:db8::1\nnameserver ::1\n", "", nil},
		{"stub and no resolved file", "nameserver 127.0.0.53\n", "", nil},
		{"nothing", "", "", nil},
		{"malformed lines", "nameserver\nnameserver not-an-ip\nnameserver 0.0.0.0\n", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := hostResolvers([]byte(tc.conf), []byte(tc.resolvedConf)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("hostResolvers = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCorefileForwards(t *testing.T) {
	c := corefile("/kc", defaults.of(IPv4), []string{"192.0.2.1", "192.0.2.2"})
	for _, want := range []string{"hosts /etc/hosts {\n        fallthrough\n    }", "forward . 192.0.2.1 192.0.2.2\n"} {
		if !strings.Contains(c, want) {
			t.Errorf("Corefile lacks %q:\n%s", want, c)
		}
	}
	if c := corefile("/kc", defaults.of(IPv4), nil); strings.Contains(c, "forward") {
		t.Errorf("Corefile with no upstream forwards:\n%s", c)
	}
}
