package up

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/labcloud/labcloud/lab"
)

// defaultsOf are the default lab's addresses for family f.
func defaultsOf(f lab.IPFamily) lab.Addresses { return lab.Addressing{}.Of(f) }

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
	c := corefile("/kc", defaultsOf(lab.IPv4), []string{"192.0.2.1", "192.0.2.2"})
	for _, want := range []string{"hosts /etc/hosts {\n        fallthrough\n    }", "forward . 192.0.2.1 192.0.2.2\n"} {
		if !strings.Contains(c, want) {
			t.Errorf("Corefile lacks %q:\n%s", want, c)
		}
	}
	if c := corefile("/kc", defaultsOf(lab.IPv4), nil); strings.Contains(c, "forward") {
		t.Errorf("Corefile with no upstream forwards:\n%s", c)
	}
}

// CoreDNS binds the bridge's address of each family; kube-dns has a
// cluster IP and an EndpointSlice of each.
func TestDNSPerFamily(t *testing.T) {
	for _, f := range lab.IPFamilies {
		t.Run(string(f), func(t *testing.T) {
			a := defaultsOf(f)
			if c := corefile("/kc", defaultsOf(f), nil); !strings.Contains(c, "bind "+strings.Join(a.Gateways(), " ")+"\n") {
				t.Errorf("Corefile binds otherwise:\n%s", c)
			}
			svc := kubeDNS(defaultsOf(f))
			if svc.Spec.ClusterIP != a.ClusterDNS()[0] || !slices.Equal(svc.Spec.ClusterIPs, a.ClusterDNS()) {
				t.Errorf("kube-dns cluster IPs %s %v", svc.Spec.ClusterIP, svc.Spec.ClusterIPs)
			}
			if dual := svc.Spec.IPFamilyPolicy != nil && *svc.Spec.IPFamilyPolicy == v1.IPFamilyPolicyRequireDualStack; dual != (f == lab.DualStack) {
				t.Errorf("kube-dns ipFamilyPolicy %v", svc.Spec.IPFamilyPolicy)
			}
			eps := kubeDNSEndpoints(defaultsOf(f))
			if len(eps) != len(a.Gateways()) {
				t.Fatalf("%d EndpointSlices, want %d", len(eps), len(a.Gateways()))
			}
			for i, s := range eps {
				typ := discoveryv1.AddressTypeIPv4
				if netip.MustParseAddr(a.Gateways()[i]).Is6() {
					typ = discoveryv1.AddressTypeIPv6
				}
				if s.AddressType != typ || s.Endpoints[0].Addresses[0] != a.Gateways()[i] {
					t.Errorf("slice %s: %s %v", s.Name, s.AddressType, s.Endpoints[0].Addresses)
				}
			}
		})
	}
}
