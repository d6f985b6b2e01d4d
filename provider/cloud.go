// Package provider implements k8s.io/cloud-provider's Interface for libvirt:
// one file per sub-interface, each over a small interface that the mechanism
// packages (libvirtcloud, netroutes, lb) satisfy.
package provider

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/libvirtcloud/tapwatch"
	"github.com/labcloud/labcloud/provider/internal/follow"
	"github.com/labcloud/labcloud/provider/outofservice"
	"github.com/labcloud/labcloud/provider/placement"
)

// ProviderName is the --cloud-provider value and the providerID scheme.
const ProviderName = "libvirt"

// Hypervisor is what the provider needs from one libvirt hypervisor.
// *libvirtcloud.Hypervisor satisfies it.
type Hypervisor interface {
	Zone() string
	// DomainByUUID and DomainByName fail with libvirtcloud.ErrNotFound only
	// when the hypervisor says the domain does not exist.
	DomainByUUID(uuid string) (libvirtcloud.Domain, error)
	DomainByName(name string) (libvirtcloud.Domain, error)
	// DomainByAddress asks the address sources (not only their caches)
	// before it fails with libvirtcloud.ErrNotFound.
	DomainByAddress(ctx context.Context, ip netip.Addr) (libvirtcloud.Domain, error)
	Addresses(ctx context.Context, d libvirtcloud.Domain) ([]netip.Addr, error)
}

// Cloud is the libvirt cloud provider.
type Cloud struct {
	cfg         Config
	hypervisors []Hypervisor
	instances   *instances
	routes      *routes // nil unless routes.bridge is configured
	// routeFollower routes this host's bridge while this replica does not
	// lead, with hypervisors on several hosts; nil otherwise.
	routeFollower *follow.Follower
	lb            *loadBalancer    // nil unless loadBalancer.bridge is configured
	lbOff         *loadBalancerOff // serves LoadBalancer Services while lb is nil
	bgp           *bgpAnnouncer    // nil unless bgp is configured
	unparsable    *unparsableReporter
	outOfService  *outofservice.Controller // nil when switched off
	ctx           context.Context
	runCtx        context.Context      // from Initialize: ends when the CCM stops
	client        kubernetes.Interface // from Initialize, for the components
}

// component is a part of the provider that needs the cluster: it is
// started by SetInformers with the CCM's client, its shared informers and
// the provider's one event recorder.
type component interface {
	start(ctx context.Context, client kubernetes.Interface, informers informers.SharedInformerFactory, recorder record.EventRecorder) error
}

var (
	_ cloudprovider.Interface    = (*Cloud)(nil)
	_ cloudprovider.InformerUser = (*Cloud)(nil)
)

// New returns a provider over already opened hypervisors.
func New(cfg Config, hypervisors []Hypervisor) *Cloud {
	c := &Cloud{cfg: cfg, hypervisors: hypervisors}
	c.instances = &instances{cfg: &c.cfg, hypervisors: hypervisors}
	c.unparsable = newUnparsableReporter(hypervisors)
	if cfg.TaintsOutOfService() {
		c.outOfService = newOutOfService(hypervisors)
	}
	if cfg.LoadBalancer.Bridge == "" {
		c.lbOff = &loadBalancerOff{}
	}
	return c
}

// Flags are the CCM command-line values the provider needs besides its
// cloud config.
type Flags struct {
	// ClusterCIDRs are --cluster-cidr's (ParseClusterCIDRs): the only
	// ranges pod-CIDR routes may go to. Without them no route is created.
	ClusterCIDRs []netip.Prefix
	// Client is the CCM's client, usable before this replica leads: what
	// runs in every replica (BGP) watches the cluster with it.
	Client kubernetes.Interface
}

// Open connects to every hypervisor of cfg (as loaded by LoadConfigFile;
// in the background: an unreachable hypervisor makes lookups fail, not
// start-up) and returns the provider. The connections live until ctx ends.
func Open(ctx context.Context, cfg Config, flags Flags) (*Cloud, error) {
	sources := make([]libvirtcloud.AddressSource, 0, len(cfg.AddressSources))
	for _, s := range cfg.AddressSources {
		switch s {
		case SourceDHCPLeases:
			sources = append(sources, libvirtcloud.SourceDHCPLeases)
		case SourceGuestAgent:
			sources = append(sources, libvirtcloud.SourceGuestAgent)
		case SourceARP:
			sources = append(sources, libvirtcloud.SourceARP)
		}
	}
	pools := cfg.ParsedPools()
	var inPools func(netip.Addr) bool // nil without pools
	if len(cfg.LoadBalancer.Pools) > 0 {
		inPools = func(ip netip.Addr) bool { _, in := pools.For(ip); return in }
	}
	hvs := make([]Hypervisor, 0, len(cfg.Hypervisors))
	opened := make([]*libvirtcloud.Hypervisor, 0, len(cfg.Hypervisors))
	for _, hc := range cfg.Hypervisors {
		h, err := libvirtcloud.Open(ctx, libvirtcloud.Options{
			URI:          hc.URI,
			Zone:         hc.Zone,
			ReadWrite:    cfg.UsesGuestAgent(),
			Networks:     cfg.Networks,
			Sources:      sources,
			ResyncPeriod: cfg.ResyncPeriod.Duration,
			Exclude:      inPools, // a VIP is never a node address, whatever a source says
		})
		if err != nil {
			return nil, fmt.Errorf("hypervisor %s: %w", hc.URI, err)
		}
		hvs, opened = append(hvs, h), append(opened, h)
	}
	if cfg.LoadBalancer.Bridge != "" {
		if err := checkPoolsAtStart(ctx, cfg.LoadBalancer.Bridge, pools, opened); err != nil {
			return nil, err
		}
		// A guest's tap leaving the bridge moves its VIPs before libvirt
		// reports the domain stopped.
		if here := localTaps(&cfg, opened); len(here) > 0 {
			if err := tapwatch.Watch(ctx, here); err != nil {
				return nil, err
			}
		}
	}
	c := New(cfg, hvs)
	c.ctx = ctx
	var (
		err     error
		replica informers.SharedInformerFactory // started once every user has registered
		// announced reads the Services' Announced conditions for the
		// answers and the VIP routes of this host.
		announced *announcedSource
	)
	if flags.Client != nil {
		replica = replicaInformers(flags.Client)
		if cfg.LoadBalancer.Bridge != "" && cfg.resolved.here != nil || cfg.BGP.Enabled() && cfg.BGP.AnnounceVIPs {
			announced = newAnnouncedSource(ctx, replica, flags.Client, cfg.LoadBalancer.Serves, pools)
		}
	}
	if cfg.Routes.Bridge != "" {
		if c.routes, err = newRoutes(cfg.Routes, flags.ClusterCIDRs, hvs); err != nil {
			return nil, err
		}
		if len(flags.ClusterCIDRs) == 0 {
			klog.FromContext(ctx).Info("routes.bridge is set but --cluster-cidr is not: every CreateRoute will be refused", "bridge", cfg.Routes.Bridge)
		}
		c.routes.otherHost = cfg.onOtherHost()
		if len(cfg.resolved.hosts) > 1 && replica != nil {
			if c.routeFollower, err = c.routes.follow(ctx, replica.Core().V1().Nodes()); err != nil {
				return nil, fmt.Errorf("routes: %w", err)
			}
		}
	}
	if cfg.LoadBalancer.Bridge != "" {
		if c.lb, err = newLoadBalancer(ctx, &c.cfg, hvs, c.instances); err != nil {
			return nil, err
		}
		// Until it leads, with hypervisors on several hosts, this
		// replica answers for its host's nodes' VIPs: the leader's
		// placement places them (placement.Lead ends the following).
		if announced != nil && cfg.resolved.here != nil {
			if err := c.lb.place.Follow(ctx, announced.reader(), c.hostHypervisors()); err != nil {
				return nil, fmt.Errorf("loadBalancer: %w", err)
			}
		}
	}
	if cfg.BGP.Enabled() {
		if flags.Client == nil {
			return nil, errors.New("bgp: no client to watch the Nodes with")
		}
		if c.bgp, err = newBGPAnnouncer(&c.cfg, flags.ClusterCIDRs); err != nil {
			return nil, err
		}
		if len(flags.ClusterCIDRs) == 0 {
			klog.FromContext(ctx).Info("bgp is set but --cluster-cidr is not: no pod CIDR will be announced")
		}
		var vips *announcedSource // routed mode only
		if cfg.BGP.AnnounceVIPs {
			vips = announced
		}
		if err := c.bgp.start(ctx, replica.Core().V1().Nodes(), vips); err != nil {
			return nil, fmt.Errorf("bgp: %w", err)
		}
	}
	if replica != nil {
		replica.Start(ctx.Done())
	}
	return c, nil
}

// Initialize is called by the cloud-controller-manager before controllers
// start. The components that watch the cluster start in SetInformers, on
// the CCM's own shared informers, so Nodes and Services are cached once.
func (c *Cloud) Initialize(clientBuilder cloudprovider.ControllerClientBuilder, stop <-chan struct{}) {
	ctx := c.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		<-stop
		cancel()
	}()
	c.runCtx = ctx
	if c.routeFollower != nil {
		// Leading: the route controller routes this host's bridge now.
		c.routeFollower.Halt()
		c.routeFollower = nil
	}
	if len(c.components()) > 0 {
		c.client = clientBuilder.ClientOrDie("libvirt-cloud-provider")
	}
	klog.InfoS("libvirt cloud provider initialized", "region", c.cfg.Region, "hypervisors", len(c.hypervisors),
		"routes", c.routes != nil, "loadBalancer", c.lb != nil, "bgp", c.bgp != nil)
}

// SetInformers is called right after Initialize with the informer factory
// the CCM starts once its controllers are built (cloudprovider.InformerUser).
func (c *Cloud) SetInformers(factory informers.SharedInformerFactory) {
	parts := c.components()
	if len(parts) == 0 {
		return
	}
	// One recorder for the components' events (upstream's controllers
	// each keep their own).
	recorder := newRecorder(c.runCtx, c.client)
	for _, p := range parts {
		if err := p.start(c.runCtx, c.client, factory, recorder); err != nil {
			klog.Fatalf("libvirt cloud provider: %v", err)
		}
	}
}

// newRecorder records events with client until ctx ends, through a
// broadcaster of its own: one correlator, one writer to the API server.
func newRecorder(ctx context.Context, client kubernetes.Interface) record.EventRecorder {
	b := record.NewBroadcaster(record.WithContext(ctx), record.WithCorrelatorOptions(record.CorrelatorOptions{LRUCacheSize: eventCorrelatorObjects}))
	b.StartStructuredLogging(2)
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	go func() {
		<-ctx.Done()
		b.Shutdown()
	}()
	return b.NewRecorder(scheme.Scheme, v1.EventSource{Component: "libvirt-cloud-provider"})
}

// eventCorrelatorObjects is how many objects' recent events the provider's
// event correlator remembers (client-go's default is 4096), to count
// repeats instead of writing new Events and to rate-limit each object. What
// repeats is a few Services at a time (a VIP moving back and forth); a
// burst of 1000 Services, each announced once, held an entry per Service
// in each of its three caches for the next 10 minutes.
const eventCorrelatorObjects = 256

func (c *Cloud) components() []component {
	var parts []component
	if c.unparsable != nil && len(c.unparsable.sources) > 0 {
		parts = append(parts, c.unparsable)
	}
	if c.outOfService != nil {
		parts = append(parts, outOfServicePart{c.outOfService})
	}
	if c.routes != nil {
		parts = append(parts, c.routes)
	}
	if c.lb != nil {
		parts = append(parts, c.lb)
	}
	if c.lbOff != nil {
		parts = append(parts, c.lbOff)
	}
	return parts
}

// ProviderName returns "libvirt".
func (c *Cloud) ProviderName() string { return ProviderName }

// HasClusterID is true: one libvirt host runs one cluster, named by --cluster-name.
func (c *Cloud) HasClusterID() bool { return true }

// InstancesV2 serves Nodes from libvirt domains.
func (c *Cloud) InstancesV2() (cloudprovider.InstancesV2, bool) { return c.instances, true }

// Instances is the deprecated interface; InstancesV2 replaces it.
func (c *Cloud) Instances() (cloudprovider.Instances, bool) { return nil, false }

// Zones is deprecated; zones come from InstancesV2 metadata.
func (c *Cloud) Zones() (cloudprovider.Zones, bool) { return nil, false }

// Clusters is not implemented.
func (c *Cloud) Clusters() (cloudprovider.Clusters, bool) { return nil, false }

// Routes programs pod-CIDR routes on the bridge, when one is configured.
func (c *Cloud) Routes() (cloudprovider.Routes, bool) { return c.routes, c.routes != nil }

// LoadBalancerClass is the loadBalancerClass this CCM serves ("" for
// none) and whether it serves Services without a class.
func (c *Cloud) LoadBalancerClass() (class string, serveClassless bool) {
	return c.cfg.LoadBalancer.Class, c.cfg.LoadBalancer.ServesClassless()
}

// LoadBalancer serves Services of type LoadBalancer; without a configured
// bridge and pools it tells each Service what to set.
func (c *Cloud) LoadBalancer() (cloudprovider.LoadBalancer, bool) {
	if c.lb != nil {
		return c.lb, true
	}
	return c.lbOff, true
}

// hostHypervisors are the hypervisors on this CCM's host, with the bridge
// their guests use.
func (c *Cloud) hostHypervisors() []placement.HostHypervisor {
	var out []placement.HostHypervisor
	for i, hc := range c.cfg.Hypervisors {
		if d, ok := c.hypervisors[i].(placement.HostDomains); ok && hc.Host == c.cfg.Host {
			out = append(out, placement.HostHypervisor{Domains: d, Bridge: hc.Bridge})
		}
	}
	return out
}

// newOutOfService returns the out-of-service taint's controller over the
// hypervisors that publish their domains' changes (nil if none does).
func newOutOfService(hypervisors []Hypervisor) *outofservice.Controller {
	var hvs []outofservice.Hypervisor
	for _, h := range hypervisors {
		if o, ok := h.(outofservice.Hypervisor); ok {
			hvs = append(hvs, o)
		}
	}
	if len(hvs) == 0 {
		return nil
	}
	return outofservice.New(hvs, domainUUID)
}

// outOfServicePart starts the out-of-service controller as a component.
type outOfServicePart struct{ *outofservice.Controller }

func (p outOfServicePart) start(ctx context.Context, client kubernetes.Interface, factory informers.SharedInformerFactory, recorder record.EventRecorder) error {
	return p.Start(ctx, client, factory, recorder)
}

// localTaps are the hypervisors whose guests' taps are this host's: on
// this host by the config, and reached through a local socket.
func localTaps(cfg *Config, opened []*libvirtcloud.Hypervisor) tapHandlers {
	var here tapHandlers
	for _, h := range opened {
		u, err := url.Parse(h.URI())
		if err == nil && u.Host == "" && (cfg.resolved.here == nil || cfg.resolved.here[h.Zone()]) {
			here = append(here, h)
		}
	}
	return here
}

// tapHandlers tells every local hypervisor of a tap: only the one whose
// domain it was acts on it.
type tapHandlers []*libvirtcloud.Hypervisor

func (hs tapHandlers) TapGone(dev string, at time.Time) {
	for _, h := range hs {
		h.TapGone(dev, at)
	}
}

func (hs tapHandlers) TapBack(dev string) {
	for _, h := range hs {
		h.TapBack(dev)
	}
}
