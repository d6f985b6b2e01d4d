package provider

import (
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestLoadConfig(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		wantErr string // substring; "" means valid
		check   func(t *testing.T, c Config)
	}{
		{name: "empty gives defaults", yaml: "", check: func(t *testing.T, c Config) {
			if c.Region != "labcloud" || len(c.Hypervisors) != 1 || c.Hypervisors[0].URI != "qemu:///system" || c.Hypervisors[0].Zone != "local" {
				t.Errorf("defaults: %+v", c)
			}
			if c.ResyncPeriod.Duration != 5*time.Minute || c.UsesGuestAgent() {
				t.Errorf("defaults: %+v", c)
			}
		}},
		{name: "zone from remote host", yaml: "hypervisors: [{uri: 'qemu+tls://kvm1.lan/system'}, {uri: 'qemu:///system', zone: rack-2}]", check: func(t *testing.T, c Config) {
			if c.Hypervisors[0].Zone != "kvm1.lan" || c.Hypervisors[1].Zone != "rack-2" {
				t.Errorf("zones: %+v", c.Hypervisors)
			}
		}},
		{name: "hosts and bridges", yaml: `
host: kvm1.lan
loadBalancer: {bridge: br-lan, pools: [{name: lab, addresses: [10.0.0.0/28]}]}
routes: {bridge: br-pods}
hypervisors:
- {uri: 'qemu+tls://root@kvm1.lan/system'}
- {uri: 'qemu+tls://kvm2.lan/system', host: kvm-two, bridge: br0}
- {uri: 'qemu:///system', zone: here}`, check: func(t *testing.T, c Config) {
			want := []HypervisorConfig{
				{URI: "qemu+tls://root@kvm1.lan/system", Zone: "kvm1.lan", Host: "kvm1.lan", Bridge: "br-lan"},
				{URI: "qemu+tls://kvm2.lan/system", Zone: "kvm2.lan", Host: "kvm-two", Bridge: "br0"},
				{URI: "qemu:///system", Zone: "here", Host: "kvm1.lan", Bridge: "br-lan"},
			}
			if !slices.Equal(c.Hypervisors, want) {
				t.Errorf("hypervisors = %+v, want %+v", c.Hypervisors, want)
			}
		}},
		{name: "host defaults to this machine", yaml: "hypervisors: [{uri: 'qemu:///system'}]", check: func(t *testing.T, c Config) {
			name, _ := os.Hostname()
			if c.Host != name || c.Hypervisors[0].Host != name || c.Hypervisors[0].Bridge != "" {
				t.Errorf("host %q, hypervisor %+v; want host %q and no bridge", c.Host, c.Hypervisors[0], name)
			}
		}},
		{name: "bridge from routes without a load balancer", yaml: "routes: {bridge: virbr1}", check: func(t *testing.T, c Config) {
			if c.Hypervisors[0].Bridge != "virbr1" {
				t.Errorf("bridge = %q, want routes.bridge", c.Hypervisors[0].Bridge)
			}
		}},
		{name: "one remote host needs no host of its own", yaml: "host: ctl\nhypervisors: [{uri: 'qemu+tls://kvm1.lan/system'}]", check: func(t *testing.T, c Config) {
			if c.Host != "ctl" || c.Hypervisors[0].Host != "kvm1.lan" {
				t.Errorf("host %q, hypervisor %+v", c.Host, c.Hypervisors[0])
			}
		}},
		{name: "guest agent source", yaml: "addressSources: [guest-agent, dhcp-leases]", check: func(t *testing.T, c Config) {
			if !c.UsesGuestAgent() {
				t.Error("guest agent not detected")
			}
		}},
		{name: "region wrong type", yaml: "region: [this, is, not, a, string]", wantErr: "Config.region"},
		{name: "region not a label value", yaml: "region: 'eu west'", wantErr: `region: "eu west"`},
		{name: "unknown field", yaml: "regoin: x", wantErr: `unknown field "regoin"`},
		{name: "empty hypervisor list", yaml: "hypervisors: []", wantErr: "hypervisors: at least one"},
		{name: "bad uri", yaml: "hypervisors: [{uri: 'not a uri'}]", wantErr: `hypervisors[0].uri: "not a uri"`},
		{name: "duplicate zone", yaml: "hypervisors: [{uri: 'qemu:///system'}, {uri: 'test:///default'}]", wantErr: `hypervisors[1].zone: "local"`},
		{name: "host not a label value", yaml: "host: 'kvm 1'", wantErr: `host: "kvm 1" must be a valid label value`},
		{name: "hypervisor host not a label value", yaml: "hypervisors: [{uri: 'qemu:///system'}, {uri: 'test:///default', zone: t, host: 'kvm/2'}]", wantErr: `hypervisors[1].host: "kvm/2" must be a valid label value`},
		{name: "host not among several", yaml: "host: ctl\nhypervisors: [{uri: 'qemu+tls://kvm1.lan/system'}, {uri: 'qemu+tls://kvm2.lan/system'}]",
			wantErr: `host: "ctl" is not the host of any hypervisor (kvm1.lan, kvm2.lan)`},
		{name: "bad address source", yaml: "addressSources: [dhcp]", wantErr: `addressSources[0]: "dhcp"`},
		{name: "repeated address source", yaml: "addressSources: [arp, arp]", wantErr: `addressSources[1]: "arp" is listed twice`},
		{name: "bad size", yaml: "instanceTypes: {sizes: [{name: small, vcpus: 0, memoryMiB: 512}]}", wantErr: "instanceTypes.sizes[0].vcpus"},
		{name: "short resync", yaml: "resyncPeriod: 10ms", wantErr: "resyncPeriod"},
		{name: "bad duration", yaml: "resyncPeriod: soon", wantErr: "soon"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := LoadConfig(strings.NewReader(tt.yaml))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				tt.check(t, c)
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestLoadConfigFileNamesThePath(t *testing.T) {
	_, err := LoadConfigFile("/does/not/exist.yaml")
	if err == nil || !strings.Contains(err.Error(), "/does/not/exist.yaml") {
		t.Fatalf("err = %v", err)
	}
	c, err := LoadConfigFile("")
	if err != nil || c.Region != "labcloud" {
		t.Fatalf("no file: %+v, %v", c, err)
	}
}

func TestLoadConfigRoutesAndLoadBalancer(t *testing.T) {
	c, err := LoadConfig(strings.NewReader(`
routes: {bridge: virbr1}
loadBalancer:
  bridge: virbr1
  pools: [{name: lab, addresses: [192.168.122.200-192.168.122.250]}]
`))
	if err != nil || c.Routes.Bridge != "virbr1" || len(c.LoadBalancer.Pools) != 1 || c.LoadBalancer.RoutedTraffic != RoutedSpread {
		t.Fatalf("%+v, %v", c, err)
	}
	for yaml, want := range map[string]string{
		"routes: {protocol: 2}":                                                   "routes.bridge: required",
		"routes: {bridge: b, protocol: 3}":                                        `routes.protocol: "3"`,
		"routes: {bridge: b, table: 255}":                                         `routes.table: "255"`,
		"loadBalancer: {bridge: b}":                                               "loadBalancer.pools: at least one",
		"loadBalancer: {pools: [{name: a, addresses: [10.0.0.0/24]}]}":            "loadBalancer.bridge: required",
		"loadBalancer: {bridge: b, pools: [{name: a, addresses: [10.0.0.1/24]}]}": "loadBalancer.pools: pool \"a\"",
		"loadBalancer: {bridge: b, pools: [{name: a, addresses: [10.0.0.0/24]}, {name: b, addresses: [10.0.0.5]}]}": "overlap",
		"loadBalancer: {bridge: b, pools: [{name: a, addresses: [10.0.0.0/24]}], routedTraffic: ecmp}":              `loadBalancer.routedTraffic: "ecmp" is not "spread" or "announcer"`,
	} {
		if _, err := LoadConfig(strings.NewReader(yaml)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", yaml, err, want)
		}
	}
}

// The example users copy must load as shipped.
func TestExampleCloudConfigLoads(t *testing.T) {
	c, err := LoadConfigFile("../examples/cloud-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Routes.Bridge != "virbr0" || len(c.LoadBalancer.Pools) != 1 || len(c.InstanceTypes.Sizes) != 2 {
		t.Errorf("example config = %+v", c)
	}
}

// TestRoutesProtocolOwnedElsewhere: routes.protocol takes no number the
// kernel, a routing daemon or labcloud's own VIP routes use: listing
// "our" routes by it would list theirs, and Reconcile would delete them.
func TestRoutesProtocolOwnedElsewhere(t *testing.T) {
	for _, tc := range []struct {
		protocol int
		want     string // substring of the error; "" when accepted
	}{
		{protocol: 0},   // the default, 76
		{protocol: 76},  // the default, spelled out
		{protocol: 201}, // nobody's
		{protocol: 254},
		{protocol: 2, want: `routes.protocol: "2" must be 5..255`},
		{protocol: 256, want: `routes.protocol: "256" must be 5..255`},
		{protocol: 77, want: `routes.protocol: "77" is labcloud's VIP routes' own (loadBalancer.routedTraffic: spread)`},
		{protocol: 8, want: `routes.protocol: "8" is gated's`},
		{protocol: 9, want: `routes.protocol: "9" is ra's`},
		{protocol: 11, want: `routes.protocol: "11" is zebra's (FRR, Quagga)`},
		{protocol: 12, want: `routes.protocol: "12" is bird's`},
		{protocol: 16, want: `routes.protocol: "16" is dhcp's`},
		{protocol: 17, want: `routes.protocol: "17" is mrouted's`},
		{protocol: 18, want: `routes.protocol: "18" is keepalived's`},
		{protocol: 42, want: `routes.protocol: "42" is babel's`},
		{protocol: 99, want: `routes.protocol: "99" is openr's`},
		{protocol: 186, want: `routes.protocol: "186" is bgp's`},
		{protocol: 188, want: `routes.protocol: "188" is ospf's`},
		{protocol: 192, want: `routes.protocol: "192" is eigrp's`},
		{protocol: 196, want: `routes.protocol: "196" is FRR's static routes'`},
	} {
		_, err := LoadConfig(strings.NewReader(fmt.Sprintf("routes: {bridge: b, protocol: %d}", tc.protocol)))
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("routes.protocol %d: err = %v, want %q", tc.protocol, err, tc.want)
		}
	}
}

// Loading resolves, once, what the consumers read: the parsed pools, the
// hypervisors' hosts and which zones are this host's.
func TestLoadConfigResolves(t *testing.T) {
	c, err := LoadConfig(strings.NewReader(`
host: kvm-b
hypervisors:
- {uri: 'qemu+ssh://kvm-a/system', zone: z1}
- {uri: 'qemu:///system', zone: z2}
- {uri: 'qemu+ssh://kvm-a/session', zone: z3}
loadBalancer: {bridge: br0, pools: [{name: lab, addresses: [10.0.0.0/28]}, {name: six, addresses: ['fd00::/120']}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	pools := c.ParsedPools()
	if pools == nil || len(pools.List()) != 2 || pools.List()[0].Name() != "lab" || pools.List()[1].Name() != "six" {
		t.Fatalf("parsed pools = %v, want lab and six in order", pools)
	}
	if p, ok := pools.For(netip.MustParseAddr("fd00::7")); !ok || p.Name() != "six" {
		t.Errorf("fd00::7 is in pool %v, want six", p)
	}
	if want := []string{"kvm-a", "kvm-b"}; !reflect.DeepEqual(c.resolved.hosts, want) {
		t.Errorf("hosts = %v, want %v", c.resolved.hosts, want)
	}
	if want := map[string]bool{"z1": false, "z2": true, "z3": false}; !reflect.DeepEqual(c.resolved.here, want) {
		t.Errorf("zones here = %v, want %v", c.resolved.here, want)
	}

	one, err := LoadConfig(strings.NewReader("host: ctl\nhypervisors: [{uri: 'qemu+ssh://kvm-a/system'}]"))
	if err != nil {
		t.Fatal(err)
	}
	if one.resolved.here != nil || len(one.ParsedPools().List()) != 0 || !reflect.DeepEqual(one.resolved.hosts, []string{"kvm-a"}) {
		t.Errorf("one remote host, no pools: %+v, want no zones apart, no pools, host kvm-a", one.resolved)
	}
}

// resolvedOf is c with what loading derives from its fields, taken as
// filled in (nothing is defaulted or validated): for tests that build a
// Config by hand.
func resolvedOf(t *testing.T, c Config) Config {
	t.Helper()
	if err := c.resolve(); err != nil {
		t.Fatal(err)
	}
	return c
}
