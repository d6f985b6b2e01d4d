// Package provider implements k8s.io/cloud-provider's Interface for libvirt:
// one file per sub-interface, each over a small interface that the mechanism
// packages (libvirtcloud, netroutes, lb) satisfy.
package provider

import (
	"context"
	"fmt"
	"net/netip"

	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/libvirtcloud"
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
	DomainByAddress(ip netip.Addr) (libvirtcloud.Domain, bool)
	Addresses(ctx context.Context, d libvirtcloud.Domain) ([]netip.Addr, error)
}

// Cloud is the libvirt cloud provider.
type Cloud struct {
	cfg         Config
	hypervisors []Hypervisor
	instances   *instances
}

var _ cloudprovider.Interface = (*Cloud)(nil)

// New returns a provider over already opened hypervisors.
func New(cfg Config, hypervisors []Hypervisor) *Cloud {
	c := &Cloud{cfg: cfg, hypervisors: hypervisors}
	c.instances = &instances{cfg: &c.cfg, hypervisors: hypervisors}
	return c
}

// Open connects to every configured hypervisor (in the background: an
// unreachable hypervisor makes lookups fail, not start-up) and returns the
// provider. The connections live until ctx ends.
func Open(ctx context.Context, cfg Config) (*Cloud, error) {
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
	hvs := make([]Hypervisor, 0, len(cfg.Hypervisors))
	for _, hc := range cfg.Hypervisors {
		h, err := libvirtcloud.Open(ctx, libvirtcloud.Options{
			URI:          hc.URI,
			Zone:         hc.Zone,
			ReadWrite:    cfg.UsesGuestAgent(),
			Networks:     cfg.Networks,
			Sources:      sources,
			ResyncPeriod: cfg.ResyncPeriod.Duration,
		})
		if err != nil {
			return nil, fmt.Errorf("hypervisor %s: %w", hc.URI, err)
		}
		hvs = append(hvs, h)
	}
	return New(cfg, hvs), nil
}

// Initialize is called by the cloud-controller-manager before controllers start.
func (c *Cloud) Initialize(_ cloudprovider.ControllerClientBuilder, _ <-chan struct{}) {
	klog.InfoS("libvirt cloud provider initialized", "region", c.cfg.Region, "hypervisors", len(c.hypervisors))
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

// Routes is not implemented yet.
func (c *Cloud) Routes() (cloudprovider.Routes, bool) { return nil, false }

// LoadBalancer is not implemented yet.
func (c *Cloud) LoadBalancer() (cloudprovider.LoadBalancer, bool) { return nil, false }
