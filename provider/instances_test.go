package provider

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/libvirtcloud"
)

// fixtureCloud is a provider over libvirt's test driver loaded with
// testdata/hosts.xml (zone "zone-a"), plus any extra hypervisors.
func fixtureCloud(t *testing.T, cfg Config, extra ...libvirtcloud.Options) *Cloud {
	t.Helper()
	path, err := filepath.Abs("testdata/hosts.xml")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var hvs []Hypervisor
	for i, o := range append([]libvirtcloud.Options{{URI: "test://" + path, Zone: "zone-a", ReadWrite: true,
		Sources: []libvirtcloud.AddressSource{libvirtcloud.SourceDHCPLeases, libvirtcloud.SourceGuestAgent}}}, extra...) {
		h, err := libvirtcloud.Open(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
			if err := h.WaitSynced(wctx); err != nil {
				t.Fatal(err)
			}
			wcancel()
		}
		hvs = append(hvs, h)
	}
	return New(cfg, hvs)
}

func node(name string, mutate ...func(*v1.Node)) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, m := range mutate {
		m(n)
	}
	return n
}

func withProviderID(id string) func(*v1.Node) { return func(n *v1.Node) { n.Spec.ProviderID = id } }
func withSystemUUID(u string) func(*v1.Node) {
	return func(n *v1.Node) { n.Status.NodeInfo.SystemUUID = u }
}
func withInternalIP(ip string) func(*v1.Node) {
	return func(n *v1.Node) {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: ip})
	}
}

func TestInstanceLookup(t *testing.T) {
	c := fixtureCloud(t, DefaultConfig())
	in, _ := c.InstancesV2()
	ctx := context.Background()
	tests := []struct {
		name       string
		node       *v1.Node
		exists     bool
		shutdown   bool
		providerID string
		wantErr    string
	}{
		{name: "by name", node: node("node-a"), exists: true, providerID: "libvirt://11111111-1111-1111-1111-111111111111"},
		{name: "by providerID", node: node("renamed", withProviderID("libvirt://22222222-2222-2222-2222-222222222222")), exists: true, providerID: "libvirt://22222222-2222-2222-2222-222222222222"},
		{name: "by system UUID", node: node("6666", withSystemUUID("66666666-6666-6666-6666-666666666666")), exists: true, providerID: "libvirt://66666666-6666-6666-6666-666666666666"},
		{name: "system UUID of no domain falls back to name", node: node("node-b", withSystemUUID("99999999-9999-9999-9999-999999999999")), exists: true, providerID: "libvirt://22222222-2222-2222-2222-222222222222"},
		{name: "shut off still exists", node: node("node-off"), exists: true, shutdown: true, providerID: "libvirt://33333333-3333-3333-3333-333333333333"},
		{name: "crashed is shut down", node: node("node-crashed"), exists: true, shutdown: true, providerID: "libvirt://44444444-4444-4444-4444-444444444444"},
		{name: "unknown name", node: node("ghost"), exists: false},
		{name: "providerID of a deleted domain", node: node("node-a", withProviderID("libvirt://99999999-9999-9999-9999-999999999999")), exists: false},
		{name: "foreign providerID", node: node("node-a", withProviderID("aws:///us-east-1a/i-0123")), wantErr: "does not belong to the libvirt provider"},
		{name: "malformed providerID", node: node("node-a", withProviderID("libvirt://not-a-uuid")), wantErr: "is not a domain UUID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			exists, err := in.InstanceExists(ctx, tt.node)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("InstanceExists err = %v, want %q", err, tt.wantErr)
				}
				if _, err := in.InstanceMetadata(ctx, tt.node); err == nil {
					t.Fatal("InstanceMetadata accepted a foreign providerID")
				}
				return
			}
			if err != nil || exists != tt.exists {
				t.Fatalf("InstanceExists = %v, %v; want %v, nil", exists, err, tt.exists)
			}
			shutdown, err := in.InstanceShutdown(ctx, tt.node)
			if err != nil || shutdown != tt.shutdown {
				t.Fatalf("InstanceShutdown = %v, %v; want %v", shutdown, err, tt.shutdown)
			}
			md, err := in.InstanceMetadata(ctx, tt.node)
			if !tt.exists {
				if !errors.Is(err, cloudprovider.InstanceNotFound) {
					t.Fatalf("InstanceMetadata err = %v, want InstanceNotFound", err)
				}
				return
			}
			if err != nil || md.ProviderID != tt.providerID {
				t.Fatalf("InstanceMetadata = %+v, %v; want providerID %s", md, err, tt.providerID)
			}
		})
	}
}

func TestInstanceMetadata(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Region = "homelab"
	cfg.InstanceTypes.Sizes = []InstanceSize{{Name: "small", VCPUs: 1, MemoryMiB: 1024}, {Name: "medium", VCPUs: 2, MemoryMiB: 4096}}
	c := fixtureCloud(t, cfg)
	in, _ := c.InstancesV2()
	ctx := context.Background()

	md, err := in.InstanceMetadata(ctx, node("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	if md.InstanceType != "small" || md.Zone != "zone-a" || md.Region != "homelab" {
		t.Errorf("metadata = %+v", md)
	}
	if md.AdditionalLabels[LabelHypervisor] != "zone-a" || md.AdditionalLabels[LabelDomainType] != "test" {
		t.Errorf("labels = %v", md.AdditionalLabels)
	}
	var internal, host []string
	for _, a := range md.NodeAddresses {
		switch a.Type {
		case v1.NodeInternalIP:
			internal = append(internal, a.Address)
		case v1.NodeHostName:
			host = append(host, a.Address)
		}
	}
	if len(internal) != 1 || !strings.HasPrefix(internal[0], "10.77.0.") || len(host) != 1 || host[0] != "node-a" {
		t.Errorf("addresses = %v", md.NodeAddresses)
	}

	// The address from the guest agent finds the domain of a Node whose
	// name, providerID and system UUID say nothing.
	byAddr, err := in.InstanceMetadata(ctx, node("unnamed", withInternalIP(internal[0])))
	if err != nil || byAddr.ProviderID != md.ProviderID {
		t.Fatalf("by address: %+v, %v", byAddr, err)
	}

	for name, want := range map[string]string{"node-b": "medium", "node-noif": "4cpu-8gib", "node-typed": "gpu-large"} {
		md, err := in.InstanceMetadata(ctx, node(name))
		if err != nil || md.InstanceType != want {
			t.Errorf("%s: instance type %q, %v; want %q", name, md.InstanceType, err, want)
		}
	}
	md, err = in.InstanceMetadata(ctx, node("node-noif"))
	if err != nil || len(md.NodeAddresses) != 1 || md.NodeAddresses[0].Type != v1.NodeHostName {
		t.Errorf("domain without interfaces: %+v, %v", md, err)
	}
}

func TestInstanceTypeDerived(t *testing.T) {
	for _, tt := range []struct {
		d    libvirtcloud.Domain
		want string
	}{
		{libvirtcloud.Domain{VCPUs: 1, MemoryKiB: 128 << 10}, "1cpu-128mib"},
		{libvirtcloud.Domain{VCPUs: 2, MemoryKiB: 4 << 20}, "2cpu-4gib"},
		{libvirtcloud.Domain{VCPUs: 2, MemoryKiB: 4 << 20, InstanceType: "not a label!"}, "2cpu-4gib"},
		{libvirtcloud.Domain{VCPUs: 2, MemoryKiB: 4 << 20, InstanceType: "m5.large"}, "m5.large"},
	} {
		if got := instanceType(InstanceTypesConfig{}, tt.d); got != tt.want {
			t.Errorf("instanceType(%+v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

// A second, unreachable hypervisor: a domain found on the first is still
// served, but "not found" is never answered while one cannot be asked.
func TestUnreachableHypervisorNeverMeansNotFound(t *testing.T) {
	cfg := DefaultConfig()
	c := fixtureCloud(t, cfg, libvirtcloud.Options{URI: "qemu+unix:///system?socket=" + filepath.Join(t.TempDir(), "none"), Zone: "zone-down"})
	in, _ := c.InstancesV2()
	ctx := context.Background()

	if ok, err := in.InstanceExists(ctx, node("node-a")); !ok || err != nil {
		t.Fatalf("domain on the reachable hypervisor: %v, %v", ok, err)
	}
	for _, n := range []*v1.Node{node("ghost"), node("x", withProviderID("libvirt://99999999-9999-9999-9999-999999999999"))} {
		ok, err := in.InstanceExists(ctx, n)
		if ok || err == nil || !errors.Is(err, libvirtcloud.ErrUnavailable) {
			t.Fatalf("%s: InstanceExists = %v, %v; want an ErrUnavailable error", n.Name, ok, err)
		}
		if errors.Is(err, libvirtcloud.ErrNotFound) {
			t.Fatalf("%s: error %v claims not found", n.Name, err)
		}
		if _, err := in.InstanceShutdown(ctx, n); err == nil {
			t.Fatalf("%s: InstanceShutdown gave no error", n.Name)
		}
	}
}

// BenchmarkInstanceMetadata reports the libvirt calls one InstanceMetadata
// makes in steady state (after the first lookup warmed the caches): 0.
func BenchmarkInstanceMetadata(b *testing.B) {
	path, _ := filepath.Abs("testdata/hosts.xml")
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background().V(10)))
	defer cancel()
	h, err := libvirtcloud.Open(ctx, libvirtcloud.Options{URI: "test://" + path, Zone: "zone-a", ReadWrite: true,
		Sources: []libvirtcloud.AddressSource{libvirtcloud.SourceDHCPLeases, libvirtcloud.SourceGuestAgent}})
	if err != nil {
		b.Fatal(err)
	}
	if err := h.WaitSynced(ctx); err != nil {
		b.Fatal(err)
	}
	in, _ := New(DefaultConfig(), []Hypervisor{h}).InstancesV2()
	nodes := []*v1.Node{node("node-a"), node("x", withProviderID("libvirt://22222222-2222-2222-2222-222222222222")), node("node-typed")}
	for _, n := range nodes {
		if _, err := in.InstanceMetadata(ctx, n); err != nil {
			b.Fatal(err)
		}
	}
	before := h.Calls()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := in.InstanceMetadata(ctx, nodes[i%len(nodes)]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(h.Calls()-before)/float64(b.N), "libvirt-calls/op")
}

// A Node matched by its address only (named unlike its domain, no system
// UUID) is found on a CCM that never asked that domain for its addresses:
// "not found" would delete it.
func TestNodeMatchedByAddressAloneAsksTheSources(t *testing.T) {
	ctx := context.Background()
	learn, _ := fixtureCloud(t, DefaultConfig()).InstancesV2()
	md, err := learn.InstanceMetadata(ctx, node("node-a"))
	if err != nil || len(md.NodeAddresses) < 2 {
		t.Fatalf("node-a metadata: %+v, %v", md, err)
	}
	ip := md.NodeAddresses[0].Address

	in, _ := fixtureCloud(t, DefaultConfig()).InstancesV2() // fresh caches
	n := node("worker-7", withInternalIP(ip))
	exists, err := in.InstanceExists(ctx, n)
	if err != nil || !exists {
		t.Fatalf("InstanceExists(node with InternalIP %s of node-a) = %v, %v; want true", ip, exists, err)
	}
	got, err := in.InstanceMetadata(ctx, n)
	if err != nil || got.ProviderID != md.ProviderID {
		t.Fatalf("InstanceMetadata = %+v, %v; want providerID %s", got, err, md.ProviderID)
	}
	if exists, err := in.InstanceExists(ctx, node("worker-8", withInternalIP("10.77.0.250"))); exists || err != nil {
		t.Fatalf("address of no domain: %v, %v; want false, nil", exists, err)
	}
}

// When no source knows a domain's address for a moment, the Node keeps the
// addresses it has: a Hostname-only list would replace its InternalIP.
func TestKnownAddressesKeptWhenNoSourceAnswers(t *testing.T) {
	ctx := context.Background()
	in, _ := fixtureCloud(t, DefaultConfig()).InstancesV2()
	known := []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.77.0.5"}, {Type: v1.NodeHostName, Address: "node-noif"}}
	n := node("node-noif", func(n *v1.Node) { n.Status.Addresses = known })
	md, err := in.InstanceMetadata(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(md.NodeAddresses, known) {
		t.Fatalf("addresses = %v, want the Node's own %v", md.NodeAddresses, known)
	}
	// A source that answers wins over what the Node had.
	n = node("node-a", withInternalIP("10.77.0.5"))
	md, err = in.InstanceMetadata(ctx, n)
	if err != nil || md.NodeAddresses[0].Address == "10.77.0.5" || md.NodeAddresses[0].Type != v1.NodeInternalIP {
		t.Fatalf("addresses = %v, %v; want the agent's address", md.NodeAddresses, err)
	}
}
