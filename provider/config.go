package provider

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/labcloud/labcloud/bgp"
	"github.com/labcloud/labcloud/lb"
	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/netroutes"
)

// Config is the one typed document read from --cloud-config. Defaults are
// filled in first, the file is unmarshalled over them (unknown fields are an
// error), complete names the field and value of anything wrong, and what
// the consumers derive from it is resolved once (resolve).
type Config struct {
	// Region is applied as topology.kubernetes.io/region to every Node.
	Region string `json:"region"`
	// Host is the hypervisor host this CCM runs on (default: its
	// hostname). With hypervisors on several hosts it must name one.
	Host string `json:"host"`
	// Hypervisors are the libvirt connections; each one is a zone.
	Hypervisors []HypervisorConfig `json:"hypervisors"`
	// Networks are the libvirt networks whose DHCP leases give node
	// addresses. Empty means every active network of each hypervisor.
	Networks []string `json:"networks"`
	// AddressSources is the order in which node addresses are looked for:
	// "dhcp-leases", "guest-agent", "arp". The guest agent needs a
	// read-write libvirt connection, so it is off unless listed.
	AddressSources []string `json:"addressSources"`
	// InstanceTypes says how a domain's instance type is derived.
	InstanceTypes InstanceTypesConfig `json:"instanceTypes"`
	// ResyncPeriod is how often the domain cache is rebuilt from scratch
	// in addition to lifecycle events.
	ResyncPeriod metav1.Duration `json:"resyncPeriod"`
	// Routes enables pod-CIDR routes on a host bridge.
	Routes RoutesConfig `json:"routes"`
	// LoadBalancer enables Services of type LoadBalancer.
	LoadBalancer LoadBalancerConfig `json:"loadBalancer"`
	// BGP announces each Node's pod CIDRs to BGP peers (the LAN router).
	BGP BGPConfig `json:"bgp"`
	// OutOfServiceTaint says whether a Node whose domain the hypervisors
	// confirm shut off or crashed gets node.kubernetes.io/out-of-service
	// (package outofservice); nil: yes.
	OutOfServiceTaint *bool `json:"outOfServiceTaint"`

	// resolved is derived from the fields above when the config is
	// loaded (see resolve), not read from the file.
	resolved resolved
}

// TaintsOutOfService reports whether OutOfServiceTaint is on.
func (c *Config) TaintsOutOfService() bool {
	return c.OutOfServiceTaint == nil || *c.OutOfServiceTaint
}

// RoutesConfig: pod-CIDR routes "<podCIDR> via <node InternalIP> dev
// <bridge> proto <protocol>". Without a bridge the provider offers no Routes.
type RoutesConfig struct {
	Bridge string `json:"bridge"`
	// Protocol marks labcloud's routes (default 76); only routes carrying
	// it are ever listed, changed or deleted.
	Protocol int `json:"protocol"`
	// Table holds the routes (default 0: main).
	Table int `json:"table"`
	// Metric of the routes (default 3076), chosen so that a foreign route
	// to the same destination coexists with labcloud's.
	Metric int `json:"metric"`
}

// LoadBalancerConfig: VIPs from pools, announced with ARP on a bridge.
// Without a bridge the provider offers no LoadBalancer.
type LoadBalancerConfig struct {
	Bridge string          `json:"bridge"`
	Pools  []lb.PoolConfig `json:"pools"`
	// RoutedTraffic says how the host forwards traffic to a VIP (from
	// other networks, or its own): RoutedSpread (the default) over every
	// node that may answer the VIP, or RoutedAnnouncer through the
	// answering node alone.
	RoutedTraffic string `json:"routedTraffic"`
	// Class, when set, is the loadBalancerClass (e.g. ExampleClass) whose
	// Services this CCM serves besides those without a class.
	Class string `json:"class"`
	// ServeClassless says whether Services without a loadBalancerClass
	// are served too (nil: yes).
	ServeClassless *bool `json:"serveClassless"`
}

// ExampleClass is the loadBalancerClass the documents and errors suggest.
const ExampleClass = "lb.labcloud.io/l2"

// ServesClassless reports whether Services without a loadBalancerClass
// are served.
func (c LoadBalancerConfig) ServesClassless() bool {
	return c.ServeClassless == nil || *c.ServeClassless
}

// Serves reports whether this CCM serves svc's load balancer.
func (c LoadBalancerConfig) Serves(svc *v1.Service) bool {
	if svc.Spec.LoadBalancerClass == nil {
		return c.ServesClassless()
	}
	return c.Class != "" && *svc.Spec.LoadBalancerClass == c.Class
}

// loadBalancer.routedTraffic values.
const (
	// RoutedSpread installs "<vip>/32 proto 77" with every node that may
	// answer the VIP as a next hop (the answering node alone for ClientIP
	// affinity): the kernel's multipath hash spreads connections.
	RoutedSpread = "spread"
	// RoutedAnnouncer leaves the host to reach VIPs as any client on the
	// bridge does: by ARP, through the answering node.
	RoutedAnnouncer = "announcer"
)

// HypervisorConfig is one libvirt connection.
type HypervisorConfig struct {
	// URI is the libvirt connection URI, e.g. qemu:///system.
	URI string `json:"uri"`
	// Zone defaults to the URI's host, or "local" for a local URI.
	Zone string `json:"zone"`
	// Host is the hypervisor host's name: the URI's host, else this
	// machine (Config.Host).
	Host string `json:"host"`
	// Bridge is the bridge this hypervisor's guests use (default:
	// loadBalancer.bridge, else routes.bridge): where a guest's MAC is
	// looked for, as bridges on several hosts may be named apart.
	Bridge string `json:"bridge"`
}

// InstanceTypesConfig: a domain gets the first listed size that holds its
// vCPUs and memory; with no size that fits (or none listed) the type is
// derived as "<vcpus>cpu-<memory>" (e.g. "2cpu-4gib"). A domain's metadata
// element <labcloud:instance-type> overrides both.
type InstanceTypesConfig struct {
	Sizes []InstanceSize `json:"sizes"`
}

// InstanceSize is a named instance type.
type InstanceSize struct {
	Name      string `json:"name"`
	VCPUs     int    `json:"vcpus"`
	MemoryMiB int    `json:"memoryMiB"`
}

// Address sources, in the default order.
const (
	SourceDHCPLeases = "dhcp-leases"
	SourceGuestAgent = "guest-agent"
	SourceARP        = "arp"
)

// DefaultConfig is what a missing or empty --cloud-config means.
func DefaultConfig() Config {
	return Config{
		Region:            "labcloud",
		Hypervisors:       []HypervisorConfig{{URI: "qemu:///system"}},
		AddressSources:    []string{SourceDHCPLeases, SourceARP},
		ResyncPeriod:      metav1.Duration{Duration: 5 * time.Minute},
		LoadBalancer:      LoadBalancerConfig{ServeClassless: ptr.To(true)},
		BGP:               BGPConfig{RestartTime: metav1.Duration{Duration: bgp.DefaultRestartTime}},
		OutOfServiceTaint: ptr.To(true),
	}
}

// LoadConfigFile reads, defaults and validates the file at path. An empty
// path gives the defaults.
func LoadConfigFile(path string) (Config, error) {
	if path == "" {
		cfg := DefaultConfig()
		return cfg, cfg.complete()
	}
	f, err := os.Open(path)
	if err != nil {
		return Config{}, fmt.Errorf("cloud config: %w", err)
	}
	defer f.Close()
	cfg, err := LoadConfig(f)
	if err != nil {
		return Config{}, fmt.Errorf("cloud config %s: %w", path, err)
	}
	return cfg, nil
}

// LoadConfig parses one YAML document over the defaults and validates it.
func LoadConfig(r io.Reader) (Config, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return Config{}, err
	}
	cfg := DefaultConfig()
	if len(strings.TrimSpace(string(data))) > 0 {
		// A list in the file replaces the default list rather than merging.
		if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
			return Config{}, err
		}
	}
	return cfg, cfg.complete()
}

// protocolOwners are the route protocols in use by others, and whose: the
// kernel's RTPROT_* values and /etc/iproute2/rt_protos, FRR's
// rt_protos.d/frr.conf, the neighbours netroutes.DefaultProtocol was
// chosen apart from, and labcloud's own VIP routes. Routes are listed and
// deleted by protocol, so sharing one takes over the owner's routes.
var protocolOwners = map[int]string{
	8: "gated's", 9: "ra's (router advertisements)", 10: "mrt's", 11: "zebra's (FRR, Quagga)", 12: "bird's",
	13: "dnrouted's", 14: "xorp's", 15: "ntk's", 16: "dhcp's", 17: "mrouted's", 18: "keepalived's",
	42: "babel's", 80: "calico's", 99: "openr's",
	186: "bgp's (FRR)", 187: "isis's (FRR)", 188: "ospf's (FRR)", 189: "rip's (FRR)", 190: "ripng's (FRR)",
	191: "nhrp's (FRR)", 192: "eigrp's (FRR)", 193: "ldp's (FRR)", 194: "sharp's (FRR)", 195: "pbr's (FRR)",
	196: "FRR's static routes'", 197: "openfabric's (FRR)", 198: "srte's (FRR)", 248: "kube-vip's",
	int(netroutes.VIPProtocol): "labcloud's VIP routes' own (loadBalancer.routedTraffic: spread)",
}

var (
	labelValue = regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$`)
	uriScheme  = regexp.MustCompile(`^[a-z][a-z0-9+]*://`)
)

// complete fills derived defaults, resolves and validates.
func (c *Config) complete() error {
	var errs []error
	bad := func(field string, value any, why string) {
		errs = append(errs, fmt.Errorf("%s: %q %s", field, fmt.Sprint(value), why))
	}
	if !labelValue.MatchString(c.Region) {
		bad("region", c.Region, "must be a valid label value (letters, digits, '-', '_', '.'; at most 63)")
	}
	c.completeHost(bad)
	if len(c.Hypervisors) == 0 {
		errs = append(errs, errors.New("hypervisors: at least one libvirt URI is required"))
	}
	c.completeHypervisors(bad)
	poolsErr := c.resolve()
	if hosts := c.resolved.hosts; len(hosts) > 1 && !slices.Contains(hosts, c.Host) {
		bad("host", c.Host, fmt.Sprintf("is not the host of any hypervisor (%s); name the one this CCM runs on", strings.Join(hosts, ", ")))
	}
	for i, n := range c.Networks {
		if n == "" {
			bad(fmt.Sprintf("networks[%d]", i), n, "is empty")
		}
	}
	seen := map[string]bool{}
	for i, s := range c.AddressSources {
		switch s {
		case SourceDHCPLeases, SourceGuestAgent, SourceARP:
		default:
			bad(fmt.Sprintf("addressSources[%d]", i), s, "is not one of dhcp-leases, guest-agent, arp")
		}
		if seen[s] {
			bad(fmt.Sprintf("addressSources[%d]", i), s, "is listed twice")
		}
		seen[s] = true
	}
	for i, s := range c.InstanceTypes.Sizes {
		field := fmt.Sprintf("instanceTypes.sizes[%d]", i)
		if !labelValue.MatchString(s.Name) {
			bad(field+".name", s.Name, "must be a valid label value")
		}
		if s.VCPUs <= 0 {
			bad(field+".vcpus", s.VCPUs, "must be positive")
		}
		if s.MemoryMiB <= 0 {
			bad(field+".memoryMiB", s.MemoryMiB, "must be positive")
		}
	}
	if r := c.Routes; r.Bridge != "" || r.Protocol != 0 || r.Table != 0 || r.Metric != 0 {
		if r.Bridge == "" {
			errs = append(errs, errors.New("routes.bridge: required when other routes fields are set"))
		}
		// 0-4 are the kernel's own (unspec, redirect, kernel, boot, static).
		if r.Protocol != 0 && (r.Protocol < 5 || r.Protocol > 255) {
			bad("routes.protocol", r.Protocol, "must be 5..255 (0-4 are the kernel's)")
		}
		if owner, taken := protocolOwners[r.Protocol]; taken {
			bad("routes.protocol", r.Protocol, "is "+owner+": labcloud would list, change and delete its routes as its own; leave it unset (76) or pick a number nobody uses")
		}
		if r.Table < 0 || r.Table == 255 || r.Table == 253 {
			bad("routes.table", r.Table, "must be 0 (main) or a table of labcloud's own, not local or default")
		}
		if r.Metric < 0 {
			bad("routes.metric", r.Metric, "must not be negative")
		}
	}
	if lbc := c.LoadBalancer; lbc.Bridge != "" || len(lbc.Pools) > 0 {
		if lbc.Bridge == "" {
			errs = append(errs, errors.New("loadBalancer.bridge: required when pools are set"))
		}
		if len(lbc.Pools) == 0 {
			errs = append(errs, errors.New("loadBalancer.pools: at least one pool is required"))
		}
		if poolsErr != nil {
			errs = append(errs, fmt.Errorf("loadBalancer.pools: %w", poolsErr))
		}
		if lbc.Class != "" {
			if problems := validation.IsQualifiedName(lbc.Class); len(problems) > 0 || !strings.Contains(lbc.Class, "/") {
				bad("loadBalancer.class", lbc.Class, "must be a label-style key with a domain prefix, e.g. "+ExampleClass)
			}
		}
		if lbc.Class == "" && !lbc.ServesClassless() {
			bad("loadBalancer.serveClassless", false, "with no loadBalancer.class, no Service would be served")
		}
		switch lbc.RoutedTraffic {
		case "":
			c.LoadBalancer.RoutedTraffic = RoutedSpread
		case RoutedSpread, RoutedAnnouncer:
		default:
			bad("loadBalancer.routedTraffic", lbc.RoutedTraffic, fmt.Sprintf("is not %q or %q", RoutedSpread, RoutedAnnouncer))
		}
	}
	errs = append(errs, c.BGP.validate()...)
	if c.BGP.AnnounceVIPs && len(c.LoadBalancer.Pools) == 0 {
		bad("bgp.announceVIPs", true, "needs loadBalancer.pools: without them there is no VIP to announce")
	}
	if c.ResyncPeriod.Duration < time.Second {
		bad("resyncPeriod", c.ResyncPeriod.Duration, "must be at least 1s")
	}
	return errors.Join(errs...)
}

// badValue reports a field's bad value and why it is bad.
type badValue func(field string, value any, why string)

// completeHost defaults host to this machine's hostname.
func (c *Config) completeHost(bad badValue) {
	if c.Host == "" {
		name, err := os.Hostname()
		if err != nil {
			bad("host", "", "is not set and this machine's hostname cannot be read: "+err.Error())
			return
		}
		c.Host = name
	}
	if !labelValue.MatchString(c.Host) {
		bad("host", c.Host, "must be a valid label value (set host if this machine's hostname is not one)")
	}
}

// CheckHypervisorFiles checks the files each hypervisor's transport needs
// (a remote host's ssh key and known_hosts), naming the hypervisor and the
// file. The CCM checks them before it starts; loading a config does not,
// so that withdraw, which reaches no hypervisor, still removes the routes
// of a CCM whose key is gone.
func (c Config) CheckHypervisorFiles() error {
	var errs []error
	for i, h := range c.Hypervisors {
		if err := libvirtcloud.CheckTransport(h.URI); err != nil {
			errs = append(errs, fmt.Errorf("cloud config: hypervisors[%d].uri: %q %w", i, h.URI, err))
		}
	}
	return errors.Join(errs...)
}

// completeHypervisors fills each hypervisor's zone, host and bridge, and
// validates them; it runs after completeHost.
func (c *Config) completeHypervisors(bad badValue) {
	zones := map[string]int{}
	for i := range c.Hypervisors {
		h := &c.Hypervisors[i]
		field := fmt.Sprintf("hypervisors[%d]", i)
		u, err := url.Parse(h.URI)
		if h.URI == "" || err != nil || !uriScheme.MatchString(h.URI) {
			bad(field+".uri", h.URI, "is not a libvirt URI (e.g. qemu:///system)")
			continue
		}
		if h.Zone == "" {
			h.Zone = cmp.Or(u.Hostname(), "local")
		}
		if !labelValue.MatchString(h.Zone) {
			bad(field+".zone", h.Zone, "must be a valid label value")
		}
		if j, dup := zones[h.Zone]; dup {
			bad(field+".zone", h.Zone, fmt.Sprintf("is also the zone of hypervisors[%d]; give each hypervisor its own zone", j))
		}
		zones[h.Zone] = i
		if h.Host == "" {
			h.Host = cmp.Or(u.Hostname(), c.Host)
		}
		if !labelValue.MatchString(h.Host) {
			bad(field+".host", h.Host, "must be a valid label value")
		}
		if h.Bridge == "" {
			h.Bridge = cmp.Or(c.LoadBalancer.Bridge, c.Routes.Bridge)
		}
	}
}

// hypervisorOf is the hypervisor whose zone is zone (a Domain's
// Hypervisor field).
func (c *Config) hypervisorOf(zone string) (HypervisorConfig, bool) {
	for _, h := range c.Hypervisors {
		if h.Zone == zone {
			return h, true
		}
	}
	return HypervisorConfig{}, false
}

// resolved is what loading derives from a Config's fields, once (resolve):
// every consumer reads it, nothing parses or computes it again. A Config
// changed after loading keeps the facts it was loaded with.
type resolved struct {
	// pools are loadBalancer.pools, parsed; empty without pools.
	pools *lb.Pools
	// hosts are the hypervisors' distinct hosts, sorted.
	hosts []string
	// here says which hypervisors' zones are on Host; nil with the
	// hypervisors on one host (or none named), where all are.
	here map[string]bool
}

// resolve derives c.resolved from the filled-in fields. The error is the
// pools' (lb.NewPools's), for the caller to name the field.
func (c *Config) resolve() error {
	var r resolved
	for _, h := range c.Hypervisors {
		if h.Host != "" {
			r.hosts = append(r.hosts, h.Host)
		}
	}
	slices.Sort(r.hosts)
	r.hosts = slices.Compact(r.hosts)
	if len(r.hosts) > 1 {
		r.here = map[string]bool{}
		for _, h := range c.Hypervisors {
			r.here[h.Zone] = h.Host == c.Host
		}
	}
	pools, err := lb.NewPools(c.LoadBalancer.Pools)
	r.pools = pools
	c.resolved = r
	return err
}

// ParsedPools are loadBalancer.pools as parsed when the config was loaded
// (immutable; empty without pools).
func (c *Config) ParsedPools() *lb.Pools { return c.resolved.pools }

// onThisHost says whether a Node runs on this CCM's host: its zone's
// hypervisor is on Host. With hypervisors on one host (or none named),
// every Node is: no other replica would announce it. With several, a Node
// whose zone names no hypervisor (not yet initialized) is no host's yet.
func (c *Config) onThisHost() func(*v1.Node) bool {
	here := c.resolved.here
	if here == nil {
		return func(*v1.Node) bool { return true }
	}
	return func(n *v1.Node) bool { return here[n.Labels[v1.LabelTopologyZone]] }
}

// onOtherHost says whether a Node runs on another host than this CCM's:
// its zone's hypervisor is on another host. nil with hypervisors on one
// host; a Node whose zone names no hypervisor (not yet initialized) is on
// none.
func (c *Config) onOtherHost() func(*v1.Node) bool {
	here := c.resolved.here
	if here == nil {
		return nil
	}
	return func(n *v1.Node) bool {
		mine, known := here[n.Labels[v1.LabelTopologyZone]]
		return known && !mine
	}
}

// guestBridges maps each hypervisor's zone to the bridge its guests use.
func (c *Config) guestBridges() map[string]string {
	out := make(map[string]string, len(c.Hypervisors))
	for _, h := range c.Hypervisors {
		out[h.Zone] = h.Bridge
	}
	return out
}

// UsesGuestAgent reports whether the guest agent is an address source; it
// needs a read-write libvirt connection.
func (c *Config) UsesGuestAgent() bool {
	for _, s := range c.AddressSources {
		if s == SourceGuestAgent {
			return true
		}
	}
	return false
}
