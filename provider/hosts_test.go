package provider

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/labcloud/labcloud/lb"
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
	c.cfg.resolved.here = nil // every answer on this announcer, whatever host: the MACs are what is looked at
	ann := lbtest.NewAnnouncer()
	l := newLoadBalancerWith(&c.cfg, c.hypervisors, c.instances, ann, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	client := fake.NewClientset(readyNode("node-c"), readyNode("node-d"))
	factory := informers.NewSharedInformerFactory(client, 0)
	if err := l.lead(ctx, client, factory, record.NewFakeRecorder(100)); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	served := make(chan struct{})
	go func() {
		defer close(served)
		l.serve(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-served
	})

	// Each VIP goes to node-c, with its NIC's MAC on labbr1, kvm-b's
	// bridge; none to node-d, whose only NIC is on labbr0, which on kvm-b
	// is not the guests' bridge, though rendezvous ranks it first for some.
	dFirst := 0
	for i := range 6 {
		st, err := l.EnsureLoadBalancer(ctx, "test", lbtest.Service(fmt.Sprintf("svc-%d", i)), nil)
		if err != nil {
			t.Fatal(err)
		}
		vip := netip.MustParseAddr(st.Ingress[0].IP)
		if got := ann.MAC(vip).String(); got != "52:54:00:00:01:0c" {
			t.Errorf("%s answered by %q, want node-c's NIC on labbr1, kvm-b's bridge", vip, got)
		}
		if lb.Ranked(vip, []string{"node-c", "node-d"}, 1)[0] == "node-d" {
			dFirst++
		}
	}
	if dFirst == 0 {
		t.Error("node-d ranks first for none of the VIPs: the test cannot tell that it is left out")
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
