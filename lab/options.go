package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/labcloud/labcloud/examples"
	"github.com/labcloud/labcloud/lab/uplink"
	"github.com/labcloud/labcloud/netroutes"
	"github.com/labcloud/labcloud/provider"
)

// MaxNodes is the most guests a full lab boots: one DHCP lease each from
// the network's range.
const MaxNodes = dhcpLast - dhcpFirst + 1

// Default times up waits for every Node to be Ready, initialized and routed.
const (
	DefaultWait      = 6 * time.Minute
	defaultLightWait = 3 * time.Minute // plus 100 ms per node
)

// Options configure Up and UpLight.
type Options struct {
	Nodes int
	Dir   string
	// Light runs no guests and no libvirtd (UpLight).
	Light bool
	// Hosts is the number of hypervisor hosts the guests spread over (0
	// means 1); see Host.
	Hosts int
	// Routed puts each host on a segment of its own, routed by the router
	// (lab/lan), instead of one LAN segment for all.
	Routed bool
	// IPFamily is the cluster's: ipv4 (also when empty), ipv6 or dual
	// (full lab only; see IPFamily).
	IPFamily IPFamily
	// Subnet and PodCIDR move the lab's IPv4 network (a /24) and pod
	// CIDRs (a /16 or wider) off a host that routes the defaults; empty:
	// DefaultSubnet, DefaultPodCIDR. Full lab only; see Addressing.
	Subnet, PodCIDR string
	// InsecureRegistries are registries (HOST[:PORT]) the nodes pull
	// from over plain HTTP (full lab only).
	InsecureRegistries []string
	// Fresh boots the lab even when a snapshot of its shape is stored
	// (the boot's snapshot then replaces it).
	Fresh bool
	// NoSnapshot takes no snapshot of the booted lab.
	NoSnapshot bool
	// Wait is how long up waits for the Nodes; 0 means DefaultWait, or for
	// a light lab 3 minutes plus 100 ms per node.
	Wait time.Duration
	// CCMFlags are appended to the CCM's command line as examples/ ships it.
	CCMFlags []string
	// CloudConfig is a cloud-config file the CCM reads instead of the one
	// the lab writes (full lab only); see CheckLabCloudConfig.
	CloudConfig string
	// Repo is a labcloud checkout to build missing binaries from; default
	// the current directory when it is one.
	Repo string
	// Out receives progress lines.
	Out io.Writer
	// HostListener, when set, is a listening TCP socket in the host's
	// network namespace: up starts a forwarder that accepts on it and dials
	// the API server in the lab's namespace, so the lab's kubeconfig works
	// from the host.
	HostListener *os.File
}

// FlagError is a rejected command-line value: the flag, the value and why.
type FlagError struct {
	Flag, Value, Reason string
}

func (e *FlagError) Error() string {
	return fmt.Sprintf("%s %s: %s", e.Flag, e.Value, e.Reason)
}

// Validate checks every option before anything is made: node counts
// against the full and light maxima, the wait, the extra CCM flags and the
// custom cloud config (read and validated here). It returns every problem
// at once, each a *FlagError naming the flag.
func (o Options) Validate() error {
	var errs []error
	bad := func(flag string, value any, reason string) {
		errs = append(errs, &FlagError{Flag: flag, Value: fmt.Sprint(value), Reason: reason})
	}
	if o.Light {
		if o.Nodes < 1 || o.Nodes > MaxLightNodes {
			bad("--nodes", o.Nodes, fmt.Sprintf("want 1..%d with --light", MaxLightNodes))
		}
	} else if o.Nodes < 1 || o.Nodes > MaxNodes {
		bad("--nodes", o.Nodes, fmt.Sprintf("want 1..%d guests (one DHCP lease each from .%d-%d of the lab's network); --light simulates up to %d", MaxNodes, dhcpFirst, dhcpLast, MaxLightNodes))
	}
	switch {
	case o.Routed && o.Hosts < 2:
		bad("--routed", true, "needs --hosts 2 or more: it routes between hosts")
	case o.Routed && o.IPFamily.orIPv4() != IPv4:
		bad("--routed", true, fmt.Sprintf("with --ip-family %s: a routed lab is IPv4 only", o.IPFamily))
	case o.Hosts < 0 || o.Hosts > MaxHosts:
		bad("--hosts", o.Hosts, fmt.Sprintf("want 1..%d", MaxHosts))
	case o.Hosts <= 1:
	case o.Light:
		bad("--hosts", o.Hosts, "only for the full lab: the light lab's nodes are simulated in one process")
	case o.Nodes < o.Hosts:
		bad("--hosts", o.Hosts, fmt.Sprintf("more hosts than --nodes %d: every host runs a guest", o.Nodes))
	case o.CloudConfig != "":
		bad("--hosts", o.Hosts, "not with --cloud-config: each host's replica needs a cloud config of its own, which up writes")
	}
	if _, err := ParseIPFamily(string(o.IPFamily)); err != nil && o.IPFamily != "" {
		errs = append(errs, err)
	} else if o.Light && o.IPFamily.orIPv4() != IPv4 {
		bad("--ip-family", o.IPFamily, "only ipv4 with --light: its simulated nodes have no addresses to carry another family")
	}
	errs = append(errs, o.checkAddressing()...)
	if o.Wait < 0 {
		bad("--wait", o.Wait, "must be positive")
	}
	if o.Dir == "" {
		bad("--state-dir", `""`, "must name a directory")
	}
	if err := CheckCCMFlags(o.CCMFlags); err != nil {
		errs = append(errs, err)
	}
	for _, r := range o.InsecureRegistries {
		if o.Light {
			bad("--insecure-registry", r, "only for the full lab: the light lab's nodes pull nothing")
		} else if reg, err := name.NewRegistry(r, name.StrictValidation); err != nil || reg.Name() != r || strings.Contains(r, "/") {
			bad("--insecure-registry", r, "want a registry's HOST or HOST:PORT, e.g. registry.example:5000")
		}
	}
	if o.CloudConfig != "" {
		if o.Light {
			bad("--cloud-config", o.CloudConfig, "only for the full lab: the light lab's CCM reads a libvirt test-driver fixture that up writes, and it has no bridge for routes or load balancers")
		} else if a, aerr := o.addressingErr(); aerr == nil {
			if _, err := LoadLabCloudConfig(o.CloudConfig, a); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// The flags that move the lab's IPv4 prefixes.
const (
	flagSubnet  = "--subnet"
	flagPodCIDR = "--pod-cidr"
)

// addressingErr parses --subnet and --pod-cidr (empty: the defaults)
// into the lab's Addressing, each error a *FlagError naming its flag.
func (o Options) addressingErr() (Addressing, []error) {
	var errs []error
	parse := func(flag, value, def string, bits func(int) bool, want string) netip.Prefix {
		if value == "" {
			value = def
		}
		p, err := netip.ParsePrefix(value)
		switch {
		case err != nil || !p.Addr().Is4():
			errs = append(errs, &FlagError{Flag: flag, Value: value, Reason: "want an IPv4 prefix, " + want + " (the IPv6 ones are fixed)"})
		case !bits(p.Bits()):
			errs = append(errs, &FlagError{Flag: flag, Value: value, Reason: "want " + want})
		case p.Masked() != p:
			errs = append(errs, &FlagError{Flag: flag, Value: value, Reason: fmt.Sprintf("has host bits set; want %s", p.Masked())})
		}
		return p
	}
	a := Addressing{
		Subnet:  parse(flagSubnet, o.Subnet, DefaultSubnet, func(b int) bool { return b == 24 }, "a /24 such as "+DefaultSubnet),
		PodCIDR: parse(flagPodCIDR, o.PodCIDR, DefaultPodCIDR, func(b int) bool { return b >= 8 && b <= 16 }, "a /8 to /16 such as "+DefaultPodCIDR+" (a /24 per node)"),
	}
	return a, errs
}

// addressing is the lab's Addressing of valid options.
func (o Options) addressing() Addressing {
	a, _ := o.addressingErr()
	return a
}

// checkAddressing refuses --subnet and --pod-cidr that do not parse, that
// a light lab cannot take, or that overlap each other, the Service CIDR,
// the uplink's transit or (routed) the other segments derived from them.
func (o Options) checkAddressing() []error {
	if o.Subnet == "" && o.PodCIDR == "" {
		return nil
	}
	if o.Light {
		var errs []error
		for flag, v := range map[string]string{flagSubnet: o.Subnet, flagPodCIDR: o.PodCIDR} {
			if v != "" {
				errs = append(errs, &FlagError{Flag: flag, Value: v, Reason: "only for the full lab: the light lab has no network"})
			}
		}
		return errs
	}
	if _, errs := o.addressingErr(); len(errs) > 0 {
		return errs
	}
	if o.PodCIDR != "" && o.IPFamily.orIPv4() == IPv6 {
		return []error{&FlagError{Flag: flagPodCIDR, Value: o.PodCIDR, Reason: "with --ip-family ipv6 the cluster has no IPv4 pods"}}
	}
	prefixes := append(uplinkPlan(o).Prefixes,
		uplink.Named{What: "Service CIDR", Prefix: netip.MustParsePrefix(ServiceCIDR)},
		uplink.Named{What: "uplink's transit", Prefix: uplink.Transit})
	given := map[string]string{flagSubnet: o.Subnet, flagPodCIDR: o.PodCIDR}
	var errs []error
	for i, p := range prefixes {
		for _, q := range prefixes[i+1:] {
			if !p.Prefix.Overlaps(q.Prefix) {
				continue
			}
			if given[q.Flag] != "" { // blame a flag given: the defaults overlap nothing
				p, q = q, p
			}
			errs = append(errs, &FlagError{Flag: p.Flag, Value: given[p.Flag],
				Reason: fmt.Sprintf("the lab's %s %s would overlap its %s %s", p.What, p.Prefix, q.What, q.Prefix)})
		}
	}
	return errs
}

// WaitFor is how long up waits for n nodes.
func (o Options) WaitFor(n int) time.Duration {
	switch {
	case o.Wait > 0:
		return o.Wait
	case o.Light:
		return defaultLightWait + time.Duration(n)*100*time.Millisecond
	}
	return DefaultWait
}

var ccmFlagSyntax = regexp.MustCompile(`^--[a-z0-9][a-z0-9-]*(=.*)?$`)

// CheckCCMFlags checks extra CCM flags without running the CCM: each is one
// word, --name or --name=value, and none names a flag of the shipped
// command line (examples/libvirt-cloud-controller-manager.service), which
// the lab never removes or overrides.
func CheckCCMFlags(flags []string) error {
	shipped, err := shippedCCMFlags()
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range flags {
		name, _, _ := strings.Cut(f, "=")
		switch {
		case !ccmFlagSyntax.MatchString(f):
			errs = append(errs, &FlagError{"--ccm-flag", f, "want one word --name or --name=value (e.g. --ccm-flag=--v=4)"})
		case name == "--help" || name == "--version":
			errs = append(errs, &FlagError{"--ccm-flag", f, "would make the CCM print and exit"})
		case name == "--cloud-config":
			errs = append(errs, &FlagError{"--ccm-flag", f, "the shipped command line sets --cloud-config; use labcloud up --cloud-config FILE"})
		case shipped[name]:
			errs = append(errs, &FlagError{"--ccm-flag", f, fmt.Sprintf("the shipped command line (examples/libvirt-cloud-controller-manager.service) sets %s; the lab runs the CCM as shipped and only adds flags", name)})
		}
	}
	return errors.Join(errs...)
}

func shippedCCMFlags() (map[string]bool, error) {
	args, err := examples.CCMArgs(map[string]string{examples.UnitKubeconfig: "kubeconfig", examples.UnitCloudConfig: "cloud-config.yaml"})
	if err != nil {
		return nil, fmt.Errorf("the CCM's command line from examples/: %w", err)
	}
	out := map[string]bool{}
	for _, a := range args {
		name, _, _ := strings.Cut(a, "=")
		out[name] = true
	}
	return out, nil
}

// ParseCCMFlags has the CCM binary parse extra flags, names and values,
// without starting it (it parses its flags, then prints its help): an
// unknown flag or a malformed value is rejected before the lab is touched.
func ParseCCMFlags(ctx context.Context, bin string, flags []string) error {
	if len(flags) == 0 {
		return nil
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, append(append([]string{}, flags...), "--help")...)
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Run(); err != nil {
		// cobra prints the usage, then "Error: ..." (or that first).
		why := ""
		for _, l := range strings.Split(stderr.String(), "\n") {
			if e, ok := strings.CutPrefix(strings.TrimSpace(l), "Error: "); ok {
				why = e
				break
			}
			if l = strings.TrimSpace(l); l != "" {
				why = l
			}
		}
		return &FlagError{"--ccm-flag", strings.Join(flags, " "), fmt.Sprintf("%s refuses it: %s (%v)", filepath.Base(bin), why, err)}
	}
	return nil
}

// LoadLabCloudConfig reads a custom cloud config for the full lab on a's
// network: it must pass the CCM's own validation (provider.LoadConfigFile)
// and fit the lab (CheckLabCloudConfig). Errors name --cloud-config, the
// file and the field.
func LoadLabCloudConfig(path string, a Addressing) ([]byte, error) {
	bad := func(err error) error { return &FlagError{"--cloud-config", path, err.Error()} }
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, bad(err)
	}
	cfg, err := provider.LoadConfigFile(path)
	if err != nil {
		return nil, bad(err)
	}
	if err := CheckLabCloudConfig(cfg, a); err != nil {
		return nil, bad(err)
	}
	return data, nil
}

// CheckLabCloudConfig checks that a cloud config, as loaded by
// provider.LoadConfigFile, fits the full lab on a's network.
// The CCM reads the file as it is, so it must name what the lab is made of:
// the lab's libvirtd, its network, and its bridge for routes (up waits for
// them, and status and chaos read them by protocol 76 in the main table).
// Load balancers may be off (no loadBalancer section) or on the lab's
// bridge with pools clear of the gateway and the DHCP range. Everything
// else (region, zone, address sources, instance types, resync, metric,
// pools) is the learner's to change.
func CheckLabCloudConfig(cfg provider.Config, a Addressing) error {
	var errs []error
	bad := func(field string, value any, why string) {
		errs = append(errs, fmt.Errorf("%s: %q %s", field, fmt.Sprint(value), why))
	}
	if len(cfg.Hypervisors) != 1 || cfg.Hypervisors[0].URI != labURI {
		uris := []string{}
		for _, h := range cfg.Hypervisors {
			uris = append(uris, h.URI)
		}
		bad("hypervisors", strings.Join(uris, ","), "must be exactly one, uri "+labURI+" (the lab's libvirtd)")
	}
	if len(cfg.Hypervisors) == 1 && cfg.Hypervisors[0].Bridge != Bridge {
		bad("hypervisors[0].bridge", cfg.Hypervisors[0].Bridge, "must be the lab's bridge "+Bridge+": the guests' NICs are on it")
	}
	if len(cfg.Networks) > 0 && !slices.Contains(cfg.Networks, NetworkName) {
		bad("networks", strings.Join(cfg.Networks, ","), "must be empty or list the lab's network "+NetworkName)
	}
	if cfg.Routes.Bridge != Bridge {
		bad("routes.bridge", cfg.Routes.Bridge, "must be the lab's bridge "+Bridge+": pods on different nodes reach each other only through the CCM's routes, and up waits for them")
	}
	if p := cfg.Routes.Protocol; p != 0 && p != int(netroutes.DefaultProtocol) {
		bad("routes.protocol", p, fmt.Sprintf("must be %d (or unset): up, status and chaos read the lab's routes by it", netroutes.DefaultProtocol))
	}
	if cfg.Routes.Table != 0 {
		bad("routes.table", cfg.Routes.Table, "must be 0 (main): up, status and chaos read the lab's routes there")
	}
	if lbc := cfg.LoadBalancer; lbc.Bridge != "" {
		if lbc.Bridge != Bridge {
			bad("loadBalancer.bridge", lbc.Bridge, "must be the lab's bridge "+Bridge+" (or leave loadBalancer out)")
		}
		for _, r := range reservedAddrs(a) {
			if p, ok := cfg.ParsedPools().For(r); ok {
				bad("loadBalancer.pools", p.Name(), fmt.Sprintf("holds %s, the lab's gateway or DHCP range (%s-%d, %s-%s)", r, a.Addr(dhcpFirst), dhcpLast, dhcp6First, dhcp6Last))
				break
			}
		}
	}
	return errors.Join(errs...)
}

// reservedAddrs are the bridge's addresses and the DHCP ranges of both
// families (the IPv6 ones are there whatever the family of the lab).
func reservedAddrs(a Addressing) []netip.Addr {
	out := []netip.Addr{a.Addr(gatewayHost), netip.MustParseAddr(Gateway6)}
	for i := dhcpFirst; i <= dhcpLast; i++ {
		out = append(out, a.Addr(i))
	}
	last := netip.MustParseAddr(dhcp6Last)
	for a := netip.MustParseAddr(dhcp6First); a.Compare(last) <= 0; a = a.Next() {
		out = append(out, a)
	}
	return out
}
