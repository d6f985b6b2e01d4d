package lab

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/labcloud/labcloud/provider"
)

// labConfigYAML is a custom cloud config that fits the lab: another
// region, zone, address order, instance types and pool.
const labConfigYAML = `region: learners
hypervisors: [{uri: "qemu:///system", zone: bench-1}]
networks: [labcloud]
addressSources: [arp, dhcp-leases]
instanceTypes: {sizes: [{name: tiny, vcpus: 2, memoryMiB: 1024}]}
routes: {bridge: lcbr0, metric: 100}
loadBalancer: {bridge: lcbr0, pools: [{name: mine, addresses: [10.123.0.208/29]}]}
`

func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestValidate(t *testing.T) {
	good := writeFile(t, "good.yaml", labConfigYAML)
	fileWith := func(name, from, to string) string {
		return writeFile(t, name, strings.Replace(labConfigYAML, from, to, 1))
	}
	ok := Options{Nodes: 3, Dir: "/tmp/lab"}
	for _, tt := range []struct {
		name string
		edit func(*Options)
		want []string // substrings of the error; none: valid
	}{
		{"defaults", func(*Options) {}, nil},
		{"most guests", func(o *Options) { o.Nodes = MaxNodes }, nil},
		{"no guests", func(o *Options) { o.Nodes = 0 }, []string{"--nodes 0", "1..100"}},
		{"more guests than leases", func(o *Options) { o.Nodes = MaxNodes + 1 }, []string{"--nodes 101", "DHCP"}},
		{"light zero", func(o *Options) { o.Light, o.Nodes = true, 0 }, []string{"--nodes 0", "--light"}},
		{"light many", func(o *Options) { o.Light, o.Nodes = true, MaxLightNodes }, nil},
		{"light too many", func(o *Options) { o.Light, o.Nodes = true, MaxLightNodes+1 }, []string{"--nodes 10001"}},
		{"negative wait", func(o *Options) { o.Wait = -time.Second }, []string{"--wait -1s"}},
		{"ipv6", func(o *Options) { o.IPFamily = IPv6 }, nil},
		{"dual", func(o *Options) { o.IPFamily = DualStack }, nil},
		{"unknown family", func(o *Options) { o.IPFamily = "IPv6" }, []string{"--ip-family IPv6", "ipv4, ipv6 or dual"}},
		{"light dual", func(o *Options) { o.Light, o.IPFamily = true, DualStack }, []string{"--ip-family dual", "--light"}},
		{"light ipv4", func(o *Options) { o.Light, o.IPFamily = true, IPv4 }, nil},
		{"cloud config pool in the DHCPv6 range", func(o *Options) {
			o.CloudConfig = fileWith("f.yaml", "10.123.0.208/29", "fd00:10:123::1f0-fd00:10:123::210")
		}, []string{"loadBalancer.pools", "mine", "fd00:10:123::1f0"}},
		{"no state dir", func(o *Options) { o.Dir = "" }, []string{"--state-dir"}},
		{"extra CCM flags", func(o *Options) {
			o.CCMFlags = []string{"--v=4", "--concurrent-node-syncs=2", "--feature-gates=A=true,B=false"}
		}, nil},
		{"CCM flag without dashes", func(o *Options) { o.CCMFlags = []string{"v=4"} }, []string{"--ccm-flag v=4", "--name=value"}},
		{"CCM flag two words", func(o *Options) { o.CCMFlags = []string{"--v 4"} }, []string{"--ccm-flag --v 4"}},
		{"CCM flag overriding the unit", func(o *Options) { o.CCMFlags = []string{"--leader-elect=false"} }, []string{"--ccm-flag --leader-elect=false", "shipped"}},
		{"CCM flag overriding the kubeconfig", func(o *Options) { o.CCMFlags = []string{"--kubeconfig=/x"} }, []string{"--ccm-flag --kubeconfig=/x"}},
		{"CCM cloud config by flag", func(o *Options) { o.CCMFlags = []string{"--cloud-config=/x"} }, []string{"--ccm-flag --cloud-config=/x", "up --cloud-config"}},
		{"CCM help", func(o *Options) { o.CCMFlags = []string{"--help"} }, []string{"--ccm-flag --help"}},
		{"cloud config", func(o *Options) { o.CloudConfig = good }, nil},
		{"three hosts", func(o *Options) { o.Hosts = 3 }, nil},
		{"too many hosts", func(o *Options) { o.Hosts, o.Nodes = MaxHosts+1, 20 }, []string{"--hosts 9", "1..8"}},
		{"negative hosts", func(o *Options) { o.Hosts = -1 }, []string{"--hosts -1"}},
		{"more hosts than guests", func(o *Options) { o.Hosts = 4 }, []string{"--hosts 4", "--nodes 3"}},
		{"hosts light", func(o *Options) { o.Light, o.Hosts = true, 2 }, []string{"--hosts 2", "full lab"}},
		{"hosts ipv6", func(o *Options) { o.Hosts, o.IPFamily = 2, IPv6 }, nil},
		{"hosts cloud config", func(o *Options) { o.Hosts, o.CloudConfig = 2, good }, []string{"--hosts 2", "--cloud-config"}},
		{"cloud config light", func(o *Options) { o.Light, o.CloudConfig = true, good }, []string{"--cloud-config " + good, "full lab"}},
		{"cloud config missing", func(o *Options) { o.CloudConfig = "/nonexistent/cc.yaml" }, []string{"--cloud-config /nonexistent/cc.yaml", "no such file"}},
		{"cloud config unknown field", func(o *Options) { o.CloudConfig = fileWith("f.yaml", "region:", "regoin:") }, []string{"--cloud-config", "regoin"}},
		{"cloud config bad field", func(o *Options) { o.CloudConfig = fileWith("f.yaml", "zone: bench-1", "zone: 'not a label'") }, []string{"--cloud-config", "hypervisors[0].zone"}},
		{"cloud config other hypervisor", func(o *Options) { o.CloudConfig = fileWith("f.yaml", "qemu:///system", "qemu:///session") }, []string{"--cloud-config", "hypervisors", "qemu:///session"}},
		{"cloud config other guest bridge", func(o *Options) { o.CloudConfig = fileWith("f.yaml", "zone: bench-1", "zone: bench-1, bridge: virbr0") }, []string{"hypervisors[0].bridge", "virbr0"}},
		{"cloud config other network", func(o *Options) { o.CloudConfig = fileWith("f.yaml", "networks: [labcloud]", "networks: [default]") }, []string{"networks", `"default"`}},
		{"cloud config without routes", func(o *Options) { o.CloudConfig = fileWith("f.yaml", "routes: {bridge: lcbr0, metric: 100}\n", "") }, []string{"routes.bridge"}},
		{"cloud config other protocol", func(o *Options) { o.CloudConfig = fileWith("f.yaml", "metric: 100", "protocol: 77") }, []string{"routes.protocol", "77"}},
		{"cloud config other table", func(o *Options) { o.CloudConfig = fileWith("f.yaml", "metric: 100", "table: 100") }, []string{"routes.table"}},
		{"cloud config other LB bridge", func(o *Options) {
			o.CloudConfig = fileWith("f.yaml", "loadBalancer: {bridge: lcbr0", "loadBalancer: {bridge: virbr0")
		}, []string{"loadBalancer.bridge", "virbr0"}},
		{"cloud config pool in the DHCP range", func(o *Options) { o.CloudConfig = fileWith("f.yaml", "10.123.0.208/29", "10.123.0.190-10.123.0.210") }, []string{"loadBalancer.pools", "mine", "10.123.0.190"}},
		{"cloud config pool holding the gateway", func(o *Options) { o.CloudConfig = fileWith("f.yaml", "10.123.0.208/29", "10.123.0.1") }, []string{"loadBalancer.pools", "10.123.0.1"}},
		{"cloud config without load balancers", func(o *Options) {
			o.CloudConfig = fileWith("f.yaml", "loadBalancer: {bridge: lcbr0, pools: [{name: mine, addresses: [10.123.0.208/29]}]}\n", "")
		}, nil},
		{"everything wrong at once", func(o *Options) { o.Nodes, o.Wait, o.CCMFlags = 0, -1, []string{"x"} }, []string{"--nodes 0", "--wait", "--ccm-flag x"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := ok
			tt.edit(&o)
			err := o.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want an error with %q", tt.want)
			}
			var fe *FlagError
			if !errors.As(err, &fe) {
				t.Errorf("error %v names no flag (%T)", err, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestWaitFor(t *testing.T) {
	for _, tt := range []struct {
		o    Options
		n    int
		want time.Duration
	}{
		{Options{}, 3, DefaultWait},
		{Options{Wait: time.Minute}, 3, time.Minute},
		{Options{Light: true}, 1000, 3*time.Minute + 100*time.Second},
		{Options{Light: true, Wait: 10 * time.Second}, 1000, 10 * time.Second},
	} {
		if got := tt.o.WaitFor(tt.n); got != tt.want {
			t.Errorf("%+v.WaitFor(%d) = %s, want %s", tt.o, tt.n, got, tt.want)
		}
	}
}

// The lab's own cloud configs are marshalled provider.Configs: they must
// load back unchanged through the CCM's parser, and the full lab's must
// pass the check custom configs get.
func TestLabCloudConfigsLoad(t *testing.T) {
	st := &State{Dir: "/var/lib/labcloud/lab", Light: true}
	configs := map[string]provider.Config{"light": lightCloudConfig(st)}
	one := labHosts(st.Dir, 1, Addressing{})
	for _, f := range IPFamilies {
		configs["full-"+string(f)] = labCloudConfig(defaults.Of(f), true, one, one[0])
	}
	three := labHosts(st.Dir, 3, Addressing{})
	for _, h := range three {
		configs["hosts-"+h.Name] = labCloudConfig(defaults.Of(IPv4), true, three, h)
	}
	for name, cfg := range configs {
		data, err := marshalCloudConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		got, err := provider.LoadConfigFile(writeFile(t, name+".yaml", string(data)))
		if err != nil {
			t.Fatalf("%s: the CCM rejects the lab's cloud config: %v\n%s", name, err, data)
		}
		if !sameDocument(got, cfg) {
			t.Errorf("%s: loads as\n%+v\nwant\n%+v\nfrom\n%s", name, got, cfg, data)
		}
		if h, ok := strings.CutPrefix(name, "hosts-"); ok {
			if got.Host != h || got.BGP.RouterID != three[slices.IndexFunc(three, func(x Host) bool { return x.Name == h })].Address || len(got.Hypervisors) != 3 {
				t.Errorf("%s's replica: host %q, BGP router ID %q, %d hypervisors; want itself, its bridge's address and all 3", h, got.Host, got.BGP.RouterID, len(got.Hypervisors))
			}
		} else if strings.HasPrefix(name, "full") {
			if err := CheckLabCloudConfig(got, Addressing{}); err != nil {
				t.Errorf("the lab's own cloud config does not fit the lab: %v", err)
			}
			if got.Routes.Bridge != Bridge || got.LoadBalancer.Bridge != Bridge || got.Hypervisors[0].URI != labURI {
				t.Errorf("full lab config %+v", got)
			}
		} else if !got.UsesGuestAgent() || got.Routes.Bridge != "" || got.Hypervisors[0].URI != "test:///var/lib/labcloud/lab/fixture.xml" {
			t.Errorf("light lab config %+v", got)
		}
	}
}

// sameDocument says whether a and b are deeply equal in every field of
// the document: loading also resolves what is derived from it, unexported.
func sameDocument(a, b provider.Config) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	for i := range va.NumField() {
		if va.Type().Field(i).IsExported() && !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			return false
		}
	}
	return true
}

func TestParseCCMFlags(t *testing.T) {
	ctx := context.Background()
	// A stand-in that fails the way cobra does: usage, then "Error: ...".
	fake := writeFile(t, "ccm", "#!/bin/sh\nfor a; do case $a in --bad*) printf 'Usage:\\n  ccm [flags]\\n\\nError: unknown flag: %s\\n' \"$a\" >&2; exit 1;; esac; done\nexit 0\n")
	if err := os.Chmod(fake, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := ParseCCMFlags(ctx, fake, []string{"--v=4"}); err != nil {
		t.Errorf("good flag: %v", err)
	}
	err := ParseCCMFlags(ctx, fake, []string{"--v=4", "--bad-one"})
	if err == nil || !strings.Contains(err.Error(), "--ccm-flag") || !strings.Contains(err.Error(), "unknown flag: --bad-one") {
		t.Errorf("bad flag: err = %v, want --ccm-flag and the CCM's reason", err)
	}

	// The real CCM, when make build has made it.
	_, file, _, _ := runtime.Caller(0)
	real := filepath.Join(filepath.Dir(file), "..", "bin", "libvirt-cloud-controller-manager")
	if fi, err := os.Stat(real); err != nil || !fi.Mode().IsRegular() {
		t.Skipf("no %s (make build): checked the stand-in only", real)
	}
	if err := ParseCCMFlags(ctx, real, []string{"--v=4", "--concurrent-node-syncs=3"}); err != nil {
		t.Errorf("real CCM, good flags: %v", err)
	}
	for flag, why := range map[string]string{"--no-such-flag": "unknown flag: --no-such-flag", "--v=abc": `invalid argument "abc"`} {
		if err := ParseCCMFlags(ctx, real, []string{flag}); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("real CCM, %s: err = %v, want %q", flag, err, why)
		}
	}
}

// --subnet and --pod-cidr: each refusal names its flag and the bad value.
func TestValidateAddressing(t *testing.T) {
	for _, tt := range []struct {
		name   string
		edit   func(*Options)
		flag   string   // the flag the error names; none: valid
		saying []string // more of the error
	}{
		{"moved both", func(o *Options) { o.Subnet, o.PodCIDR = "10.77.0.0/24", "10.78.0.0/16" }, "", nil},
		{"the defaults, given", func(o *Options) { o.Subnet, o.PodCIDR = DefaultSubnet, DefaultPodCIDR }, "", nil},
		{"a wider pod range", func(o *Options) { o.PodCIDR = "10.64.0.0/12" }, "", nil},
		{"routed, moved", func(o *Options) { o.Subnet, o.Hosts, o.Routed = "172.20.0.0/24", 2, true }, "", nil},
		{"dual, moved", func(o *Options) { o.Subnet, o.IPFamily = "192.168.77.0/24", DualStack }, "", nil},
		{"not a prefix", func(o *Options) { o.Subnet = "10.77.0.0" }, "--subnet 10.77.0.0", []string{"IPv4 prefix"}},
		{"IPv6 subnet", func(o *Options) { o.Subnet = "fd00:77::/64" }, "--subnet fd00:77::/64", []string{"IPv6 ones are fixed"}},
		{"a /16 subnet", func(o *Options) { o.Subnet = "10.77.0.0/16" }, "--subnet 10.77.0.0/16", []string{"/24"}},
		{"host bits", func(o *Options) { o.Subnet = "10.77.0.1/24" }, "--subnet 10.77.0.1/24", []string{"10.77.0.0/24"}},
		{"a /24 pod range", func(o *Options) { o.PodCIDR = "10.78.0.0/24" }, "--pod-cidr 10.78.0.0/24", []string{"/16"}},
		{"IPv6 pod range", func(o *Options) { o.PodCIDR = "fd00:78::/56" }, "--pod-cidr fd00:78::/56", []string{"IPv4"}},
		{"pods over the network", func(o *Options) { o.PodCIDR = "10.123.0.0/16" }, "--pod-cidr 10.123.0.0/16", []string{"network 10.123.0.0/24"}},
		{"network in the pods", func(o *Options) { o.Subnet = "10.244.7.0/24" }, "--subnet 10.244.7.0/24", []string{"pod CIDRs 10.244.0.0/16"}},
		{"network on the Services", func(o *Options) { o.Subnet = "10.96.1.0/24" }, "--subnet 10.96.1.0/24", []string{"Service CIDR " + ServiceCIDR}},
		{"pods over the Services", func(o *Options) { o.PodCIDR = "10.96.0.0/12" }, "--pod-cidr 10.96.0.0/12", []string{"Service CIDR"}},
		{"network on the transit", func(o *Options) { o.Subnet = "169.254.123.0/24" }, "--subnet 169.254.123.0/24", []string{"transit 169.254.123.0/30"}},
		{"routed: on host 2's segment", func(o *Options) { o.Subnet, o.Hosts, o.Routed = "10.77.2.0/24", 2, true },
			"--subnet 10.77.2.0/24", []string{"network of host 2 10.77.2.0/24"}},
		{"routed: on the LAN", func(o *Options) { o.Subnet, o.Hosts, o.Routed = "10.77.250.0/24", 2, true }, "--subnet", []string{"LAN 10.77.250.0/24"}},
		{"pods on IPv6", func(o *Options) { o.PodCIDR, o.IPFamily = "10.78.0.0/16", IPv6 }, "--pod-cidr 10.78.0.0/16", []string{"no IPv4 pods"}},
		{"light", func(o *Options) { o.Light, o.Subnet = true, "10.77.0.0/24" }, "--subnet 10.77.0.0/24", []string{"full lab"}},
		{"insecure registries", func(o *Options) { o.InsecureRegistries = []string{"registry.test:5000", "10.1.2.3", "[fd00::5]:5000"} }, "", nil},
		{"a registry with a path", func(o *Options) { o.InsecureRegistries = []string{"registry.test:5000/team"} }, "--insecure-registry registry.test:5000/team", []string{"HOST:PORT"}},
		{"a URL for a registry", func(o *Options) { o.InsecureRegistries = []string{"http://registry.test"} }, "--insecure-registry http://registry.test", []string{"HOST:PORT"}},
		{"a registry with a space", func(o *Options) { o.InsecureRegistries = []string{"bad host"} }, "--insecure-registry bad host", []string{"HOST:PORT"}},
		{"a registry, light", func(o *Options) { o.Light, o.InsecureRegistries = true, []string{"registry.test"} }, "--insecure-registry registry.test", []string{"full lab"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := Options{Nodes: 3, Dir: "/tmp/lab"}
			tt.edit(&o)
			err := o.Validate()
			if tt.flag == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var fe *FlagError
			if !errors.As(err, &fe) || !strings.HasPrefix(fe.Error(), tt.flag) {
				t.Fatalf("Validate() = %v, want a FlagError naming %q", err, tt.flag)
			}
			for _, w := range tt.saying {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
