package up

import (
	"errors"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/kubeletsim"
)

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
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1.LabelTopologyZone: lab.LightZone}},
			Spec:       v1.NodeSpec{ProviderID: "libvirt://x"},
			Status:     v1.NodeStatus{Conditions: ready},
		},
		{ // still tainted
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1.LabelTopologyZone: lab.LightZone}},
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
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.LabelTopologyZone: lab.LightZone}},
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
