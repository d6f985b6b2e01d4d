package provider

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/labcloud/labcloud/libvirtcloud"
	"github.com/labcloud/labcloud/provider/internal/lbtest"
)

// twoHosts is a provider over libvirt's test driver on two hosts:
// testdata/hosts.xml is zone-a on kvm-a, whose guests use the load
// balancer's bridge labbr0; testdata/hosts-b.xml is zone-b on kvm-b, whose
// guests use labbr1.
func twoHosts(t *testing.T) *Cloud {
	t.Helper()
	a, _ := filepath.Abs("testdata/hosts.xml")
	b, _ := filepath.Abs("testdata/hosts-b.xml")
	cfg, err := LoadConfig(strings.NewReader(fmt.Sprintf(`
host: kvm-a
hypervisors:
- {uri: 'test://%s', zone: zone-a, host: kvm-a}
- {uri: 'test://%s', zone: zone-b, host: kvm-b, bridge: labbr1}
loadBalancer: {bridge: labbr0, pools: [{name: lab, addresses: [10.77.0.240/28]}]}
`, a, b)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var hvs []Hypervisor
	for _, hc := range cfg.Hypervisors {
		h, err := libvirtcloud.Open(ctx, libvirtcloud.Options{URI: hc.URI, Zone: hc.Zone})
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		err = h.WaitSynced(wctx)
		wcancel()
		if err != nil {
			t.Fatal(err)
		}
		hvs = append(hvs, h)
	}
	return New(cfg, hvs)
}

func readyNode(name string) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1.NodeStatus{
		Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}},
	}}
}

// A node's MAC is looked for on its own hypervisor's bridge: a node on a
// host whose bridge is named apart from the load balancer's may answer
// VIPs, and one whose only NIC is on a bridge of that name there may not.
func TestPlacementFindsMACsOnTheirHypervisorsBridge(t *testing.T) {
	c := twoHosts(t)
	l := newLoadBalancerWith(&c.cfg, c.hypervisors, c.instances, lbtest.NewAnnouncer(), nil, nil)
	p := l.place
	nodes := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, name := range []string{"node-c", "node-d"} {
		if err := nodes.Add(readyNode(name)); err != nil {
			t.Fatal(err)
		}
	}
	p.nodes = corelisters.NewNodeLister(nodes)

	var snap snapshot
	if !p.readNodes(context.Background(), &snap) {
		t.Fatal("the Nodes could not be listed")
	}
	snap.judge(map[string]time.Time{}, map[string]bool{})
	if v, _ := snap.named("node-c"); v.facts.mac.String() != "52:54:00:00:01:0c" {
		t.Errorf("node-c's MAC = %q, want its NIC's on labbr1, kvm-b's bridge", v.facts.mac)
	}
	if v, _ := snap.named("node-d"); v.facts.mac != nil {
		t.Errorf("node-d's MAC = %q, want none: its NIC is on labbr0, which on kvm-b is not the guests' bridge", v.facts.mac)
	}
	if !slices.Equal(snap.eligible, []string{"node-c"}) {
		t.Errorf("eligible = %q, want node-c alone", snap.eligible)
	}
}

// Each Node is labelled with its hypervisor's host, beside its zone.
func TestNodesAreLabelledWithTheirHost(t *testing.T) {
	in, _ := twoHosts(t).InstancesV2()
	for name, want := range map[string][2]string{"node-a": {"zone-a", "kvm-a"}, "node-c": {"zone-b", "kvm-b"}} {
		md, err := in.InstanceMetadata(context.Background(), node(name))
		if err != nil {
			t.Fatal(err)
		}
		if got := [2]string{md.AdditionalLabels[LabelHypervisor], md.AdditionalLabels[LabelHost]}; got != want {
			t.Errorf("%s: hypervisor and host labels %q, want %q", name, got, want)
		}
	}
}

// zonedHypervisor is a fake hypervisor of a zone of its own that counts
// the lookups it is asked.
type zonedHypervisor struct {
	*lbtest.Hypervisor
	zone  string
	asked int
}

func (h *zonedHypervisor) Zone() string { return h.zone }
func (h *zonedHypervisor) DomainByUUID(uuid string) (libvirtcloud.Domain, error) {
	h.asked++
	return h.Hypervisor.DomainByUUID(uuid)
}

// A Node's own zone's hypervisor is asked first: a silent host, whose
// lookups wait for libvirt's keepalive, is not asked about other hosts'
// Nodes, while a Node not labelled yet is looked for everywhere.
func TestLookupAsksTheNodesZoneFirst(t *testing.T) {
	const uuid = "bbbbbbbb-0000-0000-0000-00000000000b"
	silent := &zonedHypervisor{Hypervisor: lbtest.NewHypervisor(nil), zone: "zone-a"}
	other := &zonedHypervisor{Hypervisor: lbtest.NewHypervisor(nil), zone: "zone-b"}
	other.Put(libvirtcloud.Domain{UUID: uuid, Name: "node-b", Hypervisor: "zone-b", State: libvirtcloud.StateRunning})
	in := &instances{cfg: &Config{}, hypervisors: []Hypervisor{silent, other}}
	n := readyNode("node-b")
	n.Spec.ProviderID = ProviderID(uuid)
	n.Labels = map[string]string{v1.LabelTopologyZone: "zone-b"}
	d, h, err := in.find(context.Background(), n)
	if err != nil || d.UUID != uuid || h != other {
		t.Fatalf("find = %v on %v, %v; want the domain on zone-b", d.UUID, h, err)
	}
	if silent.asked != 0 {
		t.Errorf("zone-a was asked %d times about a Node labelled zone-b", silent.asked)
	}
	delete(n.Labels, v1.LabelTopologyZone)
	if _, _, err := in.find(context.Background(), n); err != nil || silent.asked != 1 {
		t.Errorf("unlabelled: %v, zone-a asked %d times; want it asked first, in configured order", err, silent.asked)
	}
}
