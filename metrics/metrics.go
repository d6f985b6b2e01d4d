// Package metrics defines labcloud's Prometheus metrics, all named
// labcloud_*, in component-base's legacy registry: the registry the
// upstream cloud-controller-manager serves on its secure port's /metrics.
// The packages that own each number update it where the event happens
// (lb, lb/announce, libvirtcloud, netroutes, provider); this package only
// declares them, so it imports nothing of labcloud but its version.
//
// Metrics measure nothing until Register has been called (component-base
// creates them lazily): call it once at start-up, before anything else of
// labcloud runs. docs/reference.md's "Metrics" section documents each one.
package metrics

import (
	"runtime"
	"sync"

	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/labcloud/labcloud/version"
)

const namespace = "labcloud"

// Reasons a VIP moves to another node, the values of VIPMoves' reason label.
const (
	// MoveDomainDown: the answering node's domain stopped running (shut
	// off, crashed, undefined), left the bridge, or has not reported Ready
	// since it was last seen down.
	MoveDomainDown = "domain_down"
	// MoveHostLost: the answering node's hypervisor cannot be asked and
	// its guest stopped answering on the bridge: its host is down or cut
	// off.
	MoveHostLost = "host_lost"
	// MoveNodeNotReady: the answering node's Node is not Ready.
	MoveNodeNotReady = "node_not_ready"
	// MoveNodeDeleted: the answering node's Node is gone or being deleted.
	MoveNodeDeleted = "node_deleted"
	// MoveNodeExcluded: the Node was labelled out of load balancers.
	MoveNodeExcluded = "node_excluded"
	// MoveEndpoints: with externalTrafficPolicy Local, the node no longer
	// has a ready endpoint of the Service.
	MoveEndpoints = "endpoints"
	// MoveRebalance: the node may still answer, but another one now wins
	// the VIP (a node joined or came back).
	MoveRebalance = "rebalance"
	// MoveUnknown: the answering MAC is no known node's (e.g. a record a
	// previous leader left for a node this process never saw).
	MoveUnknown = "unknown"
)

// Route write operations, the values of RouteWrites' op label.
const (
	OpAdd     = "add"
	OpReplace = "replace"
	OpDelete  = "delete"
)

var (
	// PoolAddresses is the number of addresses a pool can hand out.
	PoolAddresses = k8smetrics.NewGaugeVec(&k8smetrics.GaugeOpts{
		Namespace: namespace, Subsystem: "lb", Name: "pool_addresses",
		Help:           "Addresses a load-balancer pool can hand out (.0/.255 left out when the pool avoids them).",
		StabilityLevel: k8smetrics.ALPHA,
	}, []string{"pool"})
	// PoolAddressesInUse is the number of a pool's addresses held by
	// at least one Service.
	PoolAddressesInUse = k8smetrics.NewGaugeVec(&k8smetrics.GaugeOpts{
		Namespace: namespace, Subsystem: "lb", Name: "pool_addresses_in_use",
		Help:           "Addresses of a load-balancer pool held by at least one Service.",
		StabilityLevel: k8smetrics.ALPHA,
	}, []string{"pool"})
	// Allocations counts addresses taken from a pool (free to held).
	Allocations = k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
		Namespace: namespace, Subsystem: "lb", Name: "allocations_total",
		Help:           "Free pool addresses handed to a Service (assignments loaded from Service status at start-up are not counted).",
		StabilityLevel: k8smetrics.ALPHA,
	}, []string{"pool"})
	// Releases counts addresses given back to a pool (held to free).
	Releases = k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
		Namespace: namespace, Subsystem: "lb", Name: "releases_total",
		Help:           "Pool addresses freed because the last Service holding them let go.",
		StabilityLevel: k8smetrics.ALPHA,
	}, []string{"pool"})
	// IPConflicts counts conflict probes that found another owner.
	IPConflicts = k8smetrics.NewCounter(&k8smetrics.CounterOpts{
		Namespace: namespace, Subsystem: "lb", Name: "ip_conflicts_total",
		Help:           "ARP probes before claiming a VIP that found another host answering for it (each retry that finds it again counts).",
		StabilityLevel: k8smetrics.ALPHA,
	})
	// VIPMoves counts VIPs that changed answering node, by reason.
	VIPMoves = k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
		Namespace: namespace, Subsystem: "lb", Name: "vip_moves_total",
		Help:           "VIPs moved from one answering node to another, by why the old node stopped answering.",
		StabilityLevel: k8smetrics.ALPHA,
	}, []string{"reason"})
	// FailoverSeconds is the time from the first sign that a domain
	// stopped (its tap leaving the bridge, or libvirt's event) to the
	// first gratuitous ARP frame for a VIP moved because of it.
	FailoverSeconds = k8smetrics.NewHistogram(&k8smetrics.HistogramOpts{
		Namespace: namespace, Subsystem: "lb", Name: "failover_seconds",
		Help:           "Time from the first sign that a domain stopped (its tap leaving the bridge, or a libvirt lifecycle event: stopped, crashed, undefined) to the first gratuitous ARP frame sent for a VIP that moved off that domain.",
		Buckets:        k8smetrics.ExponentialBuckets(0.0005, 2, 14), // 0.5 ms .. 4.1 s
		StabilityLevel: k8smetrics.ALPHA,
	})
	// PlacementPassSeconds is how long each placement pass takes.
	PlacementPassSeconds = k8smetrics.NewHistogram(&k8smetrics.HistogramOpts{
		Namespace: namespace, Subsystem: "lb", Name: "placement_pass_seconds",
		Help:           "Time a placement pass takes: it places every VIP, announces the changes and programs the routes to VIPs. Service-controller calls that arrive while one runs share the next.",
		Buckets:        k8smetrics.ExponentialBuckets(0.0001, 4, 9), // 0.1 ms .. 6.6 s
		StabilityLevel: k8smetrics.ALPHA,
	})
	// ARPReplies counts ARP requests for owned VIPs answered.
	ARPReplies = k8smetrics.NewCounter(&k8smetrics.CounterOpts{
		Namespace: namespace, Subsystem: "lb", Name: "arp_replies_total",
		Help:           "ARP requests for owned VIPs answered on the bridge.",
		StabilityLevel: k8smetrics.ALPHA,
	})
	// NDPReplies counts Neighbor Solicitations for owned VIPs answered.
	NDPReplies = k8smetrics.NewCounter(&k8smetrics.CounterOpts{
		Namespace: namespace, Subsystem: "lb", Name: "ndp_replies_total",
		Help:           "Neighbor Solicitations for owned IPv6 VIPs answered on the bridge.",
		StabilityLevel: k8smetrics.ALPHA,
	})
	// VIPsDefended counts other hosts' claims on owned VIPs answered in
	// their defence.
	VIPsDefended = k8smetrics.NewCounter(&k8smetrics.CounterOpts{
		Namespace: namespace, Subsystem: "lb", Name: "vip_defended_total",
		Help:           "Other hosts' claims on owned VIPs (ARP or Neighbor Discovery naming another MAC, IPv6 duplicate-address probes) answered by re-announcing the VIP, at most once per 10 s per VIP.",
		StabilityLevel: k8smetrics.ALPHA,
	})
	// VIPClaimsIgnored counts the claims left unanswered because the VIP
	// was defended less than 10 s before.
	VIPClaimsIgnored = k8smetrics.NewCounter(&k8smetrics.CounterOpts{
		Namespace: namespace, Subsystem: "lb", Name: "vip_claims_ignored_total",
		Help:           "Other hosts' claims on owned VIPs left unanswered because the VIP was defended less than 10 s before.",
		StabilityLevel: k8smetrics.ALPHA,
	})
	// LibvirtReconnects counts connections re-established after a loss.
	LibvirtReconnects = k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
		Namespace: namespace, Subsystem: "libvirt", Name: "reconnects_total",
		Help:           "Connections to a hypervisor re-established after it was lost.",
		StabilityLevel: k8smetrics.ALPHA,
	}, []string{"zone"})
	// LibvirtCallSeconds is the latency of libvirt API calls.
	LibvirtCallSeconds = k8smetrics.NewHistogramVec(&k8smetrics.HistogramOpts{
		Namespace: namespace, Subsystem: "libvirt", Name: "call_duration_seconds",
		Help:           "Latency of libvirt API calls, by call.",
		Buckets:        k8smetrics.ExponentialBuckets(0.0001, 4, 10), // 0.1 ms .. 26 s
		StabilityLevel: k8smetrics.ALPHA,
	}, []string{"call"})
	// LibvirtDomains is the number of domains in a hypervisor's cache.
	LibvirtDomains = k8smetrics.NewGaugeVec(&k8smetrics.GaugeOpts{
		Namespace: namespace, Subsystem: "libvirt", Name: "cached_domains",
		Help:           "Domains held in a hypervisor's cache.",
		StabilityLevel: k8smetrics.ALPHA,
	}, []string{"zone"})
	// LibvirtUnparsableDomains is the number of a hypervisor's domains
	// left out of its cache because their definition cannot be parsed.
	LibvirtUnparsableDomains = k8smetrics.NewGaugeVec(&k8smetrics.GaugeOpts{
		Namespace: namespace, Subsystem: "libvirt", Name: "unparsable_domains",
		Help:           "Domains of a hypervisor left out of its cache because their definition cannot be parsed; lookups of them fail until it can.",
		StabilityLevel: k8smetrics.ALPHA,
	}, []string{"zone"})
	// RouteWrites counts netlink route writes.
	RouteWrites = k8smetrics.NewCounterVec(&k8smetrics.CounterOpts{
		Namespace: namespace, Subsystem: "routes", Name: "writes_total",
		Help:           "Netlink writes of owned pod-CIDR routes attempted, by operation (add, replace, delete).",
		StabilityLevel: k8smetrics.ALPHA,
	}, []string{"op"})
	// BGPSessionUp is 1 while the session with a peer is established.
	BGPSessionUp = k8smetrics.NewGaugeVec(&k8smetrics.GaugeOpts{
		Namespace: namespace, Subsystem: "bgp", Name: "session_up",
		Help:           "1 while the BGP session with the peer is established, else 0.",
		StabilityLevel: k8smetrics.ALPHA,
	}, []string{"peer"})
	// BGPAcceptedRoutes is the number of routes kept from a peer.
	BGPAcceptedRoutes = k8smetrics.NewGaugeVec(&k8smetrics.GaugeOpts{
		Namespace: namespace, Subsystem: "bgp", Name: "accepted_routes",
		Help:           "Routes learned from the BGP peer that the speaker keeps after its import policy, which rejects every one: not 0 means a bug.",
		StabilityLevel: k8smetrics.ALPHA,
	}, []string{"peer"})
	// BGPAnnouncedRoutes is the number of routes the speaker announces.
	BGPAnnouncedRoutes = k8smetrics.NewGauge(&k8smetrics.GaugeOpts{
		Namespace: namespace, Subsystem: "bgp", Name: "announced_routes",
		Help:           "Routes (pod CIDRs) the BGP speaker announces to every peer.",
		StabilityLevel: k8smetrics.ALPHA,
	})
	// BuildInfo is 1, labelled with the build.
	BuildInfo = k8smetrics.NewGaugeVec(&k8smetrics.GaugeOpts{
		Namespace: namespace, Name: "build_info",
		Help:           "Always 1; labelled with labcloud's version (git describe at build time) and the Go version it was built with.",
		StabilityLevel: k8smetrics.ALPHA,
	}, []string{"version", "go_version"})
)

var registerOnce sync.Once

// Register adds every labcloud metric to the legacy registry and sets
// labcloud_build_info. Calling it again does nothing.
func Register() {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(
			PoolAddresses, PoolAddressesInUse, Allocations, Releases, IPConflicts,
			VIPMoves, FailoverSeconds, PlacementPassSeconds, ARPReplies, NDPReplies, VIPsDefended, VIPClaimsIgnored,
			LibvirtReconnects, LibvirtCallSeconds, LibvirtDomains, LibvirtUnparsableDomains,
			RouteWrites, BGPSessionUp, BGPAcceptedRoutes, BGPAnnouncedRoutes, BuildInfo,
		)
		BuildInfo.WithLabelValues(version.Get(), runtime.Version()).Set(1)
	})
}
