package provider

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	cloudproviderapi "k8s.io/cloud-provider/api"
	cloudnodeutil "k8s.io/cloud-provider/node/helpers"

	"github.com/labcloud/labcloud/libvirtcloud"
)

// nodeAddrs builds a NodeAddress list from "InternalIP=..." and
// "Hostname=..." terms.
func nodeAddrs(terms ...string) []v1.NodeAddress {
	out := make([]v1.NodeAddress, 0, len(terms))
	for _, t := range terms {
		typ, addr, _ := strings.Cut(t, "=")
		out = append(out, v1.NodeAddress{Type: v1.NodeAddressType(typ), Address: addr})
	}
	return out
}

func addrList(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func withNodeIP(v string) func(*v1.Node) {
	return func(n *v1.Node) {
		n.Annotations = map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: v}
	}
}

// Our list is what the upstream cloud-node controller then filters with
// the kubelet's --node-ip (GetNodeAddressesFromNodeIP): it must hold every
// --node-ip, or the Node stays tainted and its addresses unchanged. Each
// case runs that filter over our list, so the test fails if the controller
// would refuse it, and checks the order the Node ends up with.
func TestNodeAddressesDualStack(t *testing.T) {
	d := libvirtcloud.Domain{Name: "node-a"}
	for _, tc := range []struct {
		name   string
		node   *v1.Node
		ips    []netip.Addr // what the sources say, as libvirtcloud sorts it
		want   []v1.NodeAddress
		refuse bool // the node controller refuses our list (a contradicted --node-ip)
		final  []v1.NodeAddress
	}{{
		name: "IPv4 only",
		node: node("a"),
		ips:  addrList("10.77.0.11"),
		want: nodeAddrs("InternalIP=10.77.0.11", "Hostname=node-a"),
	}, {
		name: "dual stack, no --node-ip: IPv4 first",
		node: node("a"),
		ips:  addrList("10.77.0.11", "fd00:77::11"),
		want: nodeAddrs("InternalIP=10.77.0.11", "InternalIP=fd00:77::11", "Hostname=node-a"),
	}, {
		name: "dual stack, no --node-ip, the Node's IPv6 lease came first: IPv4 first once both are known",
		node: node("a", withInternalIP("fd00:77::11")),
		ips:  addrList("10.77.0.11", "fd00:77::11"),
		want: nodeAddrs("InternalIP=10.77.0.11", "InternalIP=fd00:77::11", "Hostname=node-a"),
	}, {
		name: "dual stack, no --node-ip, the Node is IPv6 first already: its order stays",
		node: node("a", withInternalIP("fd00:77::11"), withInternalIP("10.77.0.11")),
		ips:  addrList("10.77.0.11", "fd00:77::11"),
		want: nodeAddrs("InternalIP=fd00:77::11", "InternalIP=10.77.0.11", "Hostname=node-a"),
	}, {
		name: "--node-ip v4,v6",
		node: node("a", withNodeIP("10.77.0.11,fd00:77::11")),
		ips:  addrList("10.77.0.11", "fd00:77::11"),
		want: nodeAddrs("InternalIP=10.77.0.11", "InternalIP=fd00:77::11", "Hostname=node-a"),
	}, {
		name: "--node-ip v6,v4: IPv6 first",
		node: node("a", withNodeIP("fd00:77::11,10.77.0.11")),
		ips:  addrList("10.77.0.11", "fd00:77::11"),
		want: nodeAddrs("InternalIP=fd00:77::11", "InternalIP=10.77.0.11", "Hostname=node-a"),
	}, {
		name:  "--node-ip names a second IPv6 address: it comes first, the controller drops the other",
		node:  node("a", withNodeIP("fd00:77::12")),
		ips:   addrList("10.77.0.11", "fd00:77::11", "fd00:77::12"),
		want:  nodeAddrs("InternalIP=fd00:77::12", "InternalIP=fd00:77::11", "InternalIP=10.77.0.11", "Hostname=node-a"),
		final: nodeAddrs("InternalIP=fd00:77::12", "Hostname=node-a"),
	}, {
		name: "--node-ip v4,v6 and no source knows IPv6: the kubelet's IPv6 is kept",
		node: node("a", withNodeIP("10.77.0.11,fd00:77::11")),
		ips:  addrList("10.77.0.11"),
		want: nodeAddrs("InternalIP=10.77.0.11", "InternalIP=fd00:77::11", "Hostname=node-a"),
	}, {
		name:  "IPv6-only --node-ip, the sources know IPv4 only",
		node:  node("a", withNodeIP("fd00:77::11")),
		ips:   addrList("10.77.0.11"),
		want:  nodeAddrs("InternalIP=fd00:77::11", "InternalIP=10.77.0.11", "Hostname=node-a"),
		final: nodeAddrs("InternalIP=fd00:77::11", "Hostname=node-a"),
	}, {
		name: "no source knows IPv6 for a moment: the Node keeps its IPv6 address",
		node: node("a", withInternalIP("10.77.0.5"), withInternalIP("fd00:77::11")),
		ips:  addrList("10.77.0.11"),
		want: nodeAddrs("InternalIP=10.77.0.11", "InternalIP=fd00:77::11", "Hostname=node-a"),
	}, {
		name:   "--node-ip contradicted by a source: not added, the controller refuses",
		node:   node("a", withNodeIP("10.77.0.11,fd00:77::99")),
		ips:    addrList("10.77.0.11", "fd00:77::11"),
		want:   nodeAddrs("InternalIP=10.77.0.11", "InternalIP=fd00:77::11", "Hostname=node-a"),
		refuse: true,
	}, {
		name:   "no source knows anything yet: the kubelet is not taken at its word",
		node:   node("a", withNodeIP("10.77.0.11,fd00:77::11")),
		want:   nodeAddrs("Hostname=node-a"),
		refuse: true,
	}, {
		name:   "an unparsable --node-ip changes nothing (the controller reports it)",
		node:   node("a", withNodeIP("10.77.0.11,nonsense")),
		ips:    addrList("10.77.0.11", "fd00:77::11"),
		want:   nodeAddrs("InternalIP=10.77.0.11", "InternalIP=fd00:77::11", "Hostname=node-a"),
		refuse: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := nodeAddresses(tc.node, d, tc.ips)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("nodeAddresses = %v\nwant %v", got, tc.want)
			}
			provided, ok := tc.node.Annotations[cloudproviderapi.AnnotationAlphaProvidedIPAddr]
			if !ok {
				return
			}
			final, err := cloudnodeutil.GetNodeAddressesFromNodeIP(provided, got)
			if tc.refuse {
				if err == nil {
					t.Fatalf("the node controller accepts %v for --node-ip %s; want a refusal", got, provided)
				}
				return
			}
			if err != nil {
				t.Fatalf("the node controller refuses %v for --node-ip %s: %v", got, provided, err)
			}
			if tc.final == nil {
				tc.final = tc.want
			}
			if !slices.Equal(final, tc.final) {
				t.Errorf("the Node ends up with %v\nwant %v", final, tc.final)
			}
		})
	}
}

// addrHypervisor serves one domain with fixed addresses.
type addrHypervisor struct {
	d     libvirtcloud.Domain
	addrs []netip.Addr
}

var _ Hypervisor = addrHypervisor{}

func (f addrHypervisor) Zone() string { return "zone-a" }
func (f addrHypervisor) DomainByUUID(uuid string) (libvirtcloud.Domain, error) {
	if uuid == f.d.UUID {
		return f.d, nil
	}
	return libvirtcloud.Domain{}, libvirtcloud.ErrNotFound
}
func (f addrHypervisor) DomainByName(name string) (libvirtcloud.Domain, error) {
	if name == f.d.Name {
		return f.d, nil
	}
	return libvirtcloud.Domain{}, libvirtcloud.ErrNotFound
}
func (f addrHypervisor) DomainByAddress(_ context.Context, ip netip.Addr) (libvirtcloud.Domain, error) {
	if slices.Contains(f.addrs, ip) {
		return f.d, nil
	}
	return libvirtcloud.Domain{}, libvirtcloud.ErrNotFound
}
func (f addrHypervisor) Addresses(context.Context, libvirtcloud.Domain) ([]netip.Addr, error) {
	return slices.Clone(f.addrs), nil
}

// InstanceMetadata hands the node controller both families of a dual-stack
// domain, in the order of the kubelet's --node-ip.
func TestInstanceMetadataDualStack(t *testing.T) {
	d := libvirtcloud.Domain{UUID: "11111111-1111-1111-1111-111111111111", Name: "node-a", Hypervisor: "zone-a", State: libvirtcloud.StateRunning}
	c := New(DefaultConfig(), []Hypervisor{addrHypervisor{d: d, addrs: addrList("10.77.0.11", "fd00:77::11")}})
	in, _ := c.InstancesV2()
	n := node("node-a", withNodeIP("fd00:77::11,10.77.0.11"))
	md, err := in.InstanceMetadata(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	want := nodeAddrs("InternalIP=fd00:77::11", "InternalIP=10.77.0.11", "Hostname=node-a")
	if !slices.Equal(md.NodeAddresses, want) {
		t.Fatalf("addresses = %v, want %v", md.NodeAddresses, want)
	}
	if _, err := cloudnodeutil.GetNodeAddressesFromNodeIP(n.Annotations[cloudproviderapi.AnnotationAlphaProvidedIPAddr], md.NodeAddresses); err != nil {
		t.Errorf("the node controller refuses them: %v", err)
	}
}
