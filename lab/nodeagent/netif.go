package nodeagent

import "net/netip"

// Interfaces is the network side of the agent: a dummy interface for the
// pod addresses and host addresses on lo for the VIPs. NetlinkInterfaces is
// the real one; tests use a map.
type Interfaces interface {
	// EnsureDummy creates the dummy interface name if missing and sets it up.
	EnsureDummy(name string) error
	// Addrs lists the addresses (IPv4 and IPv6) of the interface.
	Addrs(ifname string) ([]netip.Prefix, error)
	// AddAddr adds an address to the interface.
	AddAddr(ifname string, p netip.Prefix) error
	// DelAddr removes an address from the interface.
	DelAddr(ifname string, p netip.Prefix) error
}

const (
	// PodInterface carries the pod addresses.
	PodInterface = "pod0"
	// VIPInterface carries the LoadBalancer VIPs. The guest sets
	// arp_ignore=1 and arp_announce=2, so it never answers ARP for them:
	// the cloud-controller-manager decides which node gets the traffic.
	VIPInterface = "lo"
)
