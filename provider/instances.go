package provider

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	cloudprovider "k8s.io/cloud-provider"
	cloudproviderapi "k8s.io/cloud-provider/api"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/libvirtcloud"
)

const providerIDPrefix = ProviderName + "://"

// Labels the provider adds to every Node it initializes.
const (
	LabelHypervisor = "libvirt.labcloud.io/hypervisor"
	LabelHost       = "libvirt.labcloud.io/host" // the hypervisor's host
	LabelDomainType = "libvirt.labcloud.io/domain-type"
)

// ProviderID is the providerID of a domain.
func ProviderID(uuid string) string { return providerIDPrefix + strings.ToLower(uuid) }

var uuidPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$`)

// domainUUID extracts the domain UUID from a libvirt providerID.
func domainUUID(providerID string) (string, error) {
	rest, ok := strings.CutPrefix(providerID, providerIDPrefix)
	if !ok {
		return "", fmt.Errorf("providerID %q does not belong to the %s provider (want %s<domain-uuid>)", providerID, ProviderName, providerIDPrefix)
	}
	rest = strings.Trim(rest, "/")
	if !uuidPattern.MatchString(rest) {
		return "", fmt.Errorf("providerID %q: %q is not a domain UUID", providerID, rest)
	}
	return strings.ToLower(rest), nil
}

type instances struct {
	cfg         *Config
	hypervisors []Hypervisor
}

var _ cloudprovider.InstancesV2 = (*instances)(nil)

// InstanceExists is false only when every hypervisor says the domain does
// not exist; if one cannot be asked, the answer is an error, so that the
// Node is not deleted while a hypervisor is down.
func (in *instances) InstanceExists(ctx context.Context, node *v1.Node) (bool, error) {
	_, _, err := in.find(ctx, node)
	if errors.Is(err, libvirtcloud.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// InstanceShutdown is true for a shut-off or crashed domain, which still exists.
func (in *instances) InstanceShutdown(ctx context.Context, node *v1.Node) (bool, error) {
	d, _, err := in.find(ctx, node)
	if errors.Is(err, libvirtcloud.ErrNotFound) {
		return false, nil // not shut down: gone, which InstanceExists reports
	}
	if err != nil {
		return false, err
	}
	return d.State.Down(), nil
}

// InstanceMetadata describes the Node's domain.
func (in *instances) InstanceMetadata(ctx context.Context, node *v1.Node) (*cloudprovider.InstanceMetadata, error) {
	d, hv, err := in.find(ctx, node)
	if err != nil {
		if errors.Is(err, libvirtcloud.ErrNotFound) {
			return nil, fmt.Errorf("%w: %w", cloudprovider.InstanceNotFound, err)
		}
		return nil, err
	}
	ips, err := hv.Addresses(ctx, d)
	if err != nil {
		return nil, fmt.Errorf("addresses of domain %s for node %s: %w", d.Name, node.Name, err)
	}
	addrs := nodeAddresses(node, d, ips)
	if missing := missingNodeIPs(node, addrs); len(missing) > 0 && len(ips) > 0 {
		// Not an error: the Node's other metadata is still right. (With no
		// address known yet, the guest is booting: nothing to say.)
		klog.FromContext(ctx).Info("The kubelet's --node-ip is not among the addresses the hypervisor knows for the domain; the node controller will refuse them",
			"node", node.Name, "domain", d.Name, "nodeIP", missing, "addresses", ips)
	}
	labels := map[string]string{LabelHypervisor: d.Hypervisor}
	if hc, ok := in.cfg.hypervisorOf(d.Hypervisor); ok && hc.Host != "" {
		labels[LabelHost] = hc.Host
	}
	if d.Type != "" {
		labels[LabelDomainType] = d.Type
	}
	return &cloudprovider.InstanceMetadata{
		ProviderID:       ProviderID(d.UUID),
		InstanceType:     instanceType(in.cfg.InstanceTypes, d),
		NodeAddresses:    addrs,
		Zone:             d.Hypervisor,
		Region:           in.cfg.Region,
		AdditionalLabels: labels,
	}, nil
}

// nodeAddresses are the Node's addresses given what the sources said (ips):
// InternalIPs of both families, then the Hostname.
//
// When no source knows any address (a lease being renewed, the neighbour
// entry aged out, the agent restarting), the Node's current addresses are
// returned as they are: the cloud-node controller replaces a Node's
// addresses with whatever list it gets as long as that list is not empty,
// so a Hostname-only list would drop the Node's InternalIP, and its route
// with it. (An error would also keep them, but it would also stop the
// initialization of a Node whose guest has no address yet.)
//
// The same holds for one family: a family no source knows (no DHCPv6, and
// the host has not exchanged IPv6 with the guest yet) keeps the Node's own
// InternalIPs of it, and gets the kubelet's --node-ip of it. The node
// controller accepts our list only if it holds every --node-ip (annotation
// alpha.kubernetes.io/provided-node-ip, one address or a dual-stack pair),
// else it leaves the Node tainted or its addresses as they were; where the
// hypervisor knows nothing to contradict the kubelet with, refusing would
// only keep a dual-stack Node from starting. A --node-ip that a source does
// contradict (it knows other addresses of that family) is not added: that
// refusal is the right answer.
//
// Order: --node-ip first, as the kubelet gave them (the node controller
// puts them first anyway, so the list it writes is ours); then the primary
// family (that of the first --node-ip, else of the Node's first InternalIP
// once it has both families, else IPv4), then the other. Without --node-ip
// Kubernetes takes a Node's first InternalIP as its primary address, so a
// dual-stack Node keeps its order; an IPv6-primary cluster names its
// family with --node-ip.
func nodeAddresses(node *v1.Node, d libvirtcloud.Domain, ips []netip.Addr) []v1.NodeAddress {
	if len(ips) == 0 && hasIP(node.Status.Addresses) {
		return slices.Clone(node.Status.Addresses)
	}
	current := internalIPs(node.Status.Addresses)
	provided := providedNodeIPs(node)
	internal := make([]netip.Addr, 0, len(ips)+len(current)+len(provided))
	for _, ip := range ips {
		internal = appendNew(internal, ip.Unmap())
	}
	if len(ips) > 0 {
		for _, is4 := range []bool{true, false} {
			if slices.ContainsFunc(ips, func(a netip.Addr) bool { return a.Unmap().Is4() == is4 }) {
				continue
			}
			for _, a := range slices.Concat(current, provided) {
				if a.Is4() == is4 {
					internal = appendNew(internal, a)
				}
			}
		}
	}
	primary4 := true
	switch {
	case len(provided) > 0:
		primary4 = provided[0].Is4()
	case bothFamilies(current):
		// A settled dual-stack order stays. A Node that had one family
		// only got it from whichever lease came first, which says
		// nothing of the cluster's primary family.
		primary4 = current[0].Is4()
	}
	rank := func(a netip.Addr) int {
		if i := slices.Index(provided, a); i >= 0 {
			return i // 0 or 1
		}
		if a.Is4() == primary4 {
			return 2
		}
		return 3
	}
	slices.SortStableFunc(internal, func(a, b netip.Addr) int { return cmp.Compare(rank(a), rank(b)) })

	addrs := make([]v1.NodeAddress, 0, len(internal)+1)
	for _, ip := range internal {
		addrs = append(addrs, v1.NodeAddress{Type: v1.NodeInternalIP, Address: ip.String()})
	}
	return append(addrs, v1.NodeAddress{Type: v1.NodeHostName, Address: hostname(node, d)})
}

// providedNodeIPs is the kubelet's --node-ip as the Node's annotation
// carries it; none when it is absent or does not parse (the node
// controller reports that itself).
func providedNodeIPs(node *v1.Node) []netip.Addr {
	v, ok := node.Annotations[cloudproviderapi.AnnotationAlphaProvidedIPAddr]
	if !ok || v == "" {
		return nil
	}
	var out []netip.Addr
	for _, s := range strings.Split(v, ",") {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return nil
		}
		out = append(out, ip.Unmap())
	}
	return out
}

// missingNodeIPs are the --node-ip addresses that addrs lack: the node
// controller refuses addrs while there are any.
func missingNodeIPs(node *v1.Node, addrs []v1.NodeAddress) []netip.Addr {
	var out []netip.Addr
	for _, ip := range providedNodeIPs(node) {
		if !slices.ContainsFunc(addrs, func(a v1.NodeAddress) bool {
			b, err := netip.ParseAddr(a.Address)
			return err == nil && b.Unmap() == ip
		}) {
			out = append(out, ip)
		}
	}
	return out
}

func bothFamilies(addrs []netip.Addr) bool {
	return slices.ContainsFunc(addrs, netip.Addr.Is4) && slices.ContainsFunc(addrs, netip.Addr.Is6)
}

func appendNew(addrs []netip.Addr, a netip.Addr) []netip.Addr {
	if slices.Contains(addrs, a) {
		return addrs
	}
	return append(addrs, a)
}

func hasIP(addrs []v1.NodeAddress) bool {
	for _, a := range addrs {
		if a.Type == v1.NodeInternalIP || a.Type == v1.NodeExternalIP {
			return true
		}
	}
	return false
}

// hostname keeps the kubelet's hostname when it reported one.
func hostname(node *v1.Node, d libvirtcloud.Domain) string {
	for _, a := range node.Status.Addresses {
		if a.Type == v1.NodeHostName && a.Address != "" {
			return a.Address
		}
	}
	return d.Name
}

// find maps a Node to its domain: by providerID; else by the Node's system
// UUID (a libvirt guest's SMBIOS UUID is its domain UUID); else by domain
// name; else by one of the Node's addresses. The error wraps
// libvirtcloud.ErrNotFound only when every hypervisor answered.
func (in *instances) find(ctx context.Context, node *v1.Node) (libvirtcloud.Domain, Hypervisor, error) {
	if node.Spec.ProviderID != "" {
		uuid, err := domainUUID(node.Spec.ProviderID)
		if err != nil {
			return libvirtcloud.Domain{}, nil, fmt.Errorf("node %s: %w", node.Name, err)
		}
		return in.each(node, func(h Hypervisor) (libvirtcloud.Domain, error) { return h.DomainByUUID(uuid) })
	}
	var unavailable error
	try := func(lookup func(Hypervisor) (libvirtcloud.Domain, error)) (libvirtcloud.Domain, Hypervisor, bool) {
		d, h, err := in.each(node, lookup)
		if err != nil && !errors.Is(err, libvirtcloud.ErrNotFound) {
			unavailable = err
		}
		return d, h, err == nil
	}
	if su := strings.ToLower(node.Status.NodeInfo.SystemUUID); uuidPattern.MatchString(su) {
		if d, h, ok := try(func(h Hypervisor) (libvirtcloud.Domain, error) { return h.DomainByUUID(su) }); ok {
			return d, h, nil
		}
	}
	if d, h, ok := try(func(h Hypervisor) (libvirtcloud.Domain, error) { return h.DomainByName(node.Name) }); ok {
		return d, h, nil
	}
	for _, a := range node.Status.Addresses {
		if a.Type != v1.NodeInternalIP && a.Type != v1.NodeExternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			continue
		}
		if d, h, ok := try(func(h Hypervisor) (libvirtcloud.Domain, error) { return h.DomainByAddress(ctx, ip) }); ok {
			return d, h, nil
		}
	}
	if unavailable != nil {
		return libvirtcloud.Domain{}, nil, unavailable
	}
	return libvirtcloud.Domain{}, nil, fmt.Errorf("node %s: no domain by system UUID, name or address: %w", node.Name, libvirtcloud.ErrNotFound)
}

// each asks every hypervisor, the one of the Node's zone first; the first
// that has the domain wins. Not found is the answer only if every
// hypervisor gave it. Asking the Node's own first keeps a silent host, whose
// lookups wait for libvirt's keepalive, out of the way of other hosts' Nodes.
func (in *instances) each(node *v1.Node, lookup func(Hypervisor) (libvirtcloud.Domain, error)) (libvirtcloud.Domain, Hypervisor, error) {
	var errs []error
	notFound := 0
	for h := range zoneFirst(in.hypervisors, node.Labels[v1.LabelTopologyZone]) {
		d, err := lookup(h)
		if err == nil {
			return d, h, nil
		}
		if errors.Is(err, libvirtcloud.ErrNotFound) {
			notFound++
		}
		errs = append(errs, err)
	}
	err := fmt.Errorf("node %s: %w", node.Name, errors.Join(errs...))
	if notFound == len(in.hypervisors) {
		return libvirtcloud.Domain{}, nil, err
	}
	// Strip "not found" so callers never read a partial answer as final.
	return libvirtcloud.Domain{}, nil, fmt.Errorf("node %s: %w", node.Name, errors.Join(unreachable(errs)...))
}

// zoneFirst yields hvs with the hypervisor of zone, if any, first: in the
// order each asks them, without a copy per lookup (placement looks every
// Node up on every pass).
func zoneFirst(hvs []Hypervisor, zone string) iter.Seq[Hypervisor] {
	return func(yield func(Hypervisor) bool) {
		first := -1
		if zone != "" {
			first = slices.IndexFunc(hvs, func(h Hypervisor) bool { return h.Zone() == zone })
		}
		if first >= 0 && !yield(hvs[first]) {
			return
		}
		for i, h := range hvs {
			if i != first && !yield(h) {
				return
			}
		}
	}
}

func unreachable(errs []error) []error {
	var out []error
	for _, e := range errs {
		if !errors.Is(e, libvirtcloud.ErrNotFound) {
			out = append(out, e)
		}
	}
	return out
}

// instanceType is the metadata override, else the first configured size that
// holds the domain, else "<vcpus>cpu-<memory>".
func instanceType(cfg InstanceTypesConfig, d libvirtcloud.Domain) string {
	if labelValue.MatchString(d.InstanceType) {
		return d.InstanceType // the domain's metadata override
	}
	memMiB := int(d.MemoryKiB / 1024)
	for _, s := range cfg.Sizes {
		if s.VCPUs >= d.VCPUs && s.MemoryMiB >= memMiB {
			return s.Name
		}
	}
	if memMiB > 0 && memMiB%1024 == 0 {
		return fmt.Sprintf("%dcpu-%dgib", d.VCPUs, memMiB/1024)
	}
	return fmt.Sprintf("%dcpu-%dmib", d.VCPUs, memMiB)
}
