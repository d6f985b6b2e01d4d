package lab

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/lab/kubeletsim"
)

func TestLightNodeName(t *testing.T) {
	for _, tt := range []struct {
		i, n int
		want string
	}{
		{1, 1, "lab-node-1"},
		{7, 200, "lab-node-007"},
		{200, 200, "lab-node-200"},
		{42, 1000, "lab-node-0042"},
		{10000, 10000, "lab-node-10000"},
	} {
		if got := lightNodeName(tt.i, tt.n); got != tt.want {
			t.Errorf("lightNodeName(%d, %d) = %q, want %q", tt.i, tt.n, got, tt.want)
		}
	}
}

// The fixture must load in the test driver with one running domain per
// node, named and identified as the simulator's nodes, each with its own
// guest-agent address (the CCM's only address source in light mode).
func TestWriteFixture(t *testing.T) {
	const n = 120
	path := filepath.Join(t.TempDir(), "fixture.xml")
	if err := writeFixture(path, n); err != nil {
		t.Fatal(err)
	}
	c, err := libvirt.NewConnect("test://" + path)
	if err != nil {
		t.Fatalf("test driver rejects the fixture: %v", err)
	}
	defer c.Close()
	doms, err := c.ListAllDomains(libvirt.CONNECT_LIST_DOMAINS_RUNNING)
	if err != nil {
		t.Fatal(err)
	}
	if len(doms) != n {
		t.Fatalf("%d running domains, want %d", len(doms), n)
	}
	seen := map[string]string{}
	for _, d := range doms {
		name, _ := d.GetName()
		uuid, _ := d.GetUUIDString()
		var i int
		if _, err := fmt.Sscanf(strings.TrimPrefix(name, NodePrefix), "%d", &i); err != nil || lightNodeName(i, n) != name {
			t.Errorf("domain %q is not named like a simulated node", name)
		}
		if uuid != fixtureUUID(i) {
			t.Errorf("domain %s UUID %s, want %s", name, uuid, fixtureUUID(i))
		}
		ifaces, err := d.ListAllInterfaceAddresses(libvirt.DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT)
		if err != nil || len(ifaces) != 1 || len(ifaces[0].Addrs) == 0 {
			t.Fatalf("domain %s agent addresses: %+v %v", name, ifaces, err)
		}
		addr := ifaces[0].Addrs[0].Addr
		if other, dup := seen[addr]; dup {
			t.Errorf("domains %s and %s share the agent address %s", name, other, addr)
		}
		seen[addr] = name
		d.Free()
	}
}

func TestHeartbeatFor(t *testing.T) {
	for _, tt := range []struct {
		n              int
		heartbeat, gp  time.Duration
		maxRenewPerSec float64
	}{
		{1, 10 * time.Second, 50 * time.Second, 1},
		{200, 10 * time.Second, 50 * time.Second, 20},
		{1000, 40 * time.Second, 160 * time.Second, 25},
		{10000, 5 * time.Minute, 20 * time.Minute, 34},
	} {
		hb := heartbeatFor(tt.n)
		if hb != tt.heartbeat || gracePeriodFor(hb) != tt.gp {
			t.Errorf("n=%d: heartbeat %s grace %s, want %s %s", tt.n, hb, gracePeriodFor(hb), tt.heartbeat, tt.gp)
		}
		if rate := float64(tt.n) / hb.Seconds(); rate > tt.maxRenewPerSec {
			t.Errorf("n=%d: %.1f renewals/s", tt.n, rate)
		}
	}
}

func TestCountLight(t *testing.T) {
	ready := []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}
	nodes := []v1.Node{
		{ // initialized and Ready
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1.LabelTopologyZone: lightZone}},
			Spec:       v1.NodeSpec{ProviderID: "libvirt://x"},
			Status:     v1.NodeStatus{Conditions: ready},
		},
		{ // still tainted
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1.LabelTopologyZone: lightZone}},
			Spec:       v1.NodeSpec{ProviderID: "libvirt://y", Taints: []v1.Taint{kubeletsim.UninitializedTaint}},
			Status:     v1.NodeStatus{Conditions: ready},
		},
		{ // no zone yet, not Ready
			Spec: v1.NodeSpec{ProviderID: "libvirt://z"},
		},
	}
	got := countLight(nodes)
	if want := (lightProgress{registered: 3, initialized: 1, ready: 2}); got != want {
		t.Errorf("countLight = %+v, want %+v", got, want)
	}
}

func TestLightTimeoutError(t *testing.T) {
	ready := []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}
	initialized := func(name string) v1.Node {
		return v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.LabelTopologyZone: lightZone}},
			Spec:       v1.NodeSpec{ProviderID: "libvirt://" + name},
		}
	}
	done := initialized("lab-node-1")
	done.Status.Conditions = ready
	tainted := initialized("lab-node-2")
	tainted.Spec.Taints = []v1.Taint{kubeletsim.UninitializedTaint}
	tainted.Status.Conditions = ready
	bare := v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "lab-node-3"}, Status: v1.NodeStatus{Conditions: []v1.NodeCondition{
		{Type: v1.NodeReady, Status: v1.ConditionUnknown, Reason: "NodeStatusUnknown", Message: "Kubelet stopped posting node status."}}}}
	names := []string{"lab-node-1", "lab-node-2", "lab-node-3", "lab-node-4"}
	list := &v1.NodeList{Items: []v1.Node{done, tainted, bare}}

	got := lightTimeoutError(3*time.Minute, names, list, nil).Error()
	for _, want := range []string{
		"light lab not ready after 3m0s (--wait): 3 registered, 1 initialized (providerID, zone, no uninitialized taint), 2 Ready of 4\n",
		"\n  lab-node-2: not initialized by the CCM: still tainted node.cloudprovider.kubernetes.io/uninitialized\n",
		"\n  lab-node-3: not Ready (NodeStatusUnknown: Kubelet stopped posting node status.); not initialized by the CCM: no providerID, zone \"\", want \"lab-host\"\n",
		"\n  lab-node-4: not registered",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("error does not say %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "lab-node-1") {
		t.Errorf("error names lab-node-1, which is done:\n%s", got)
	}
	got = lightTimeoutError(time.Minute, names, nil, errors.New("connection refused")).Error()
	if !strings.HasPrefix(got, "light lab not ready after 1m0s (--wait)\n  the last check failed: list Nodes: connection refused\n") {
		t.Errorf("with no List read, error = %q", got)
	}
}

func TestWriteSummary(t *testing.T) {
	s := &Status{}
	for i := 1; i <= 25; i++ {
		ready := "True"
		if i == 3 {
			ready = "False"
		}
		s.Nodes = append(s.Nodes, NodeStatus{Name: lightNodeName(i, 25), Ready: ready, ProviderID: "libvirt://" + fixtureUUID(i)})
	}
	var b bytes.Buffer
	s.WriteSummary(&b, 20)
	out := b.String()
	for _, want := range []string{"25 nodes: 24 Ready, 25 with a providerID; the first 20 (labcloud status lists them all):", "lab-node-20 "} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "lab-node-21") {
		t.Errorf("summary shows more than 20 rows:\n%s", out)
	}
	b.Reset()
	(&Status{Nodes: s.Nodes[:2]}).WriteSummary(&b, 20)
	if strings.Contains(b.String(), "nodes:") || !strings.Contains(b.String(), "lab-node-02") {
		t.Errorf("a small lab gets the plain table:\n%s", b.String())
	}
}
