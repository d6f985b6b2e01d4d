package kubeletsim

import (
	"encoding/json"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

var testHost = Host{
	SystemUUID:    "5a0e2d7c-4b1f-4e8a-9c3d-2f6b7a8c9d0e",
	BootID:        "b00t",
	KernelVersion: "6.1.0-56-cloud-amd64",
	CPUs:          1,
	MemoryBytes:   128 << 20,
}

func TestNewNode(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	n := NewNode("node-1", map[string]string{"lab.example/pool": "a", v1.LabelHostname: "ignored"}, testHost, now)
	if n.Spec.ProviderID != "" {
		t.Errorf("providerID = %q, want none (the CCM sets it)", n.Spec.ProviderID)
	}
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0] != UninitializedTaint {
		t.Errorf("taints = %v, want only %v", n.Spec.Taints, UninitializedTaint)
	}
	wantLabels := map[string]string{
		v1.LabelHostname: "node-1", v1.LabelOSStable: "linux", v1.LabelArchStable: "amd64", "lab.example/pool": "a",
	}
	if len(n.Labels) != len(wantLabels) {
		t.Errorf("labels = %v, want %v", n.Labels, wantLabels)
	}
	for k, v := range wantLabels {
		if n.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, n.Labels[k], v)
		}
	}
	if n.Status.NodeInfo.SystemUUID != testHost.SystemUUID {
		t.Errorf("systemUUID = %q", n.Status.NodeInfo.SystemUUID)
	}
	if c := findCondition(n.Status.Conditions, v1.NodeReady); c == nil || c.Status != v1.ConditionTrue || c.Reason != "KubeletReady" {
		t.Errorf("Ready condition = %+v", c)
	}
	// A fresh Node needs no status patch.
	if p, err := StatusPatch(n, testHost, now.Add(time.Second), time.Minute); err != nil || p != nil {
		t.Errorf("StatusPatch(new node) = %s, %v; want nothing", p, err)
	}
}

func TestLabelPatch(t *testing.T) {
	node := NewNode("node-1", nil, testHost, time.Now())
	if p, err := LabelPatch(node, nil); err != nil || p != nil {
		t.Errorf("LabelPatch(in sync) = %s, %v; want nothing", p, err)
	}
	delete(node.Labels, v1.LabelOSStable)
	node.Labels["topology.kubernetes.io/zone"] = "z1" // the CCM's label stays
	p, err := LabelPatch(node, map[string]string{"lab.example/pool": "a"})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"metadata":{"labels":{"kubernetes.io/os":"linux","lab.example/pool":"a"}}}`; string(p) != want {
		t.Errorf("LabelPatch = %s, want %s", p, want)
	}
}

// applyStatus applies a status patch as the API server does.
func applyStatus(t *testing.T, n *v1.Node, patch []byte) *v1.Node {
	t.Helper()
	orig, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	out, err := strategicpatch.StrategicMergePatch(orig, patch, v1.Node{})
	if err != nil {
		t.Fatal(err)
	}
	var res v1.Node
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	return &res
}

func TestStatusPatch(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	base := func() *v1.Node {
		n := NewNode("node-1", nil, testHost, t0)
		// Others' condition, which the simulator must leave alone.
		n.Status.Conditions = append(n.Status.Conditions, v1.NodeCondition{
			Type: v1.NodeNetworkUnavailable, Status: v1.ConditionFalse, Reason: "RouteCreated",
		})
		return n
	}
	tests := []struct {
		name           string
		mutate         func(*v1.Node)
		now            time.Time
		wantPatch      bool
		wantConds      []v1.NodeConditionType // conditions in the patch
		wantInfo       bool
		wantCapacity   bool
		keepTransition bool // Ready's transition time stays t0
	}{{
		name: "fresh: nothing", now: t0.Add(30 * time.Second),
	}, {
		name: "heartbeat due", now: t0.Add(time.Minute),
		wantPatch: true, wantConds: []v1.NodeConditionType{v1.NodeReady}, keepTransition: true,
	}, {
		name: "marked Unknown by the node lifecycle controller",
		mutate: func(n *v1.Node) {
			for i := range n.Status.Conditions {
				if n.Status.Conditions[i].Type != v1.NodeNetworkUnavailable {
					n.Status.Conditions[i].Status = v1.ConditionUnknown
					n.Status.Conditions[i].Reason = "NodeStatusUnknown"
				}
			}
		},
		now:       t0.Add(5 * time.Second),
		wantPatch: true,
		wantConds: []v1.NodeConditionType{v1.NodeMemoryPressure, v1.NodeDiskPressure, v1.NodePIDPressure, v1.NodeReady},
	}, {
		name:      "none of the simulator's conditions",
		mutate:    func(n *v1.Node) { n.Status.Conditions = n.Status.Conditions[len(n.Status.Conditions)-1:] },
		now:       t0,
		wantPatch: true,
		wantConds: []v1.NodeConditionType{v1.NodeMemoryPressure, v1.NodeDiskPressure, v1.NodePIDPressure, v1.NodeReady},
	}, {
		name:      "system UUID missing (status dropped at creation)",
		mutate:    func(n *v1.Node) { n.Status.NodeInfo = v1.NodeSystemInfo{} },
		now:       t0.Add(time.Second),
		wantPatch: true, wantInfo: true,
	}, {
		name:      "capacity differs",
		mutate:    func(n *v1.Node) { n.Status.Capacity[v1.ResourceCPU] = resource.MustParse("2") },
		now:       t0.Add(time.Second),
		wantPatch: true, wantCapacity: true,
	}, {
		name: "extra resources and swap info from others do not matter",
		mutate: func(n *v1.Node) {
			n.Status.Capacity["example.com/widget"] = resource.MustParse("1")
			n.Status.NodeInfo.Swap = &v1.NodeSwapStatus{}
		},
		now: t0.Add(time.Second),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := base()
			if tc.mutate != nil {
				tc.mutate(n)
			}
			p, err := StatusPatch(n, testHost, tc.now, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if (p != nil) != tc.wantPatch {
				t.Fatalf("patch = %s, want a patch: %v", p, tc.wantPatch)
			}
			if p == nil {
				return
			}
			var body statusPatch
			if err := json.Unmarshal(p, &body); err != nil {
				t.Fatal(err)
			}
			var got []v1.NodeConditionType
			for _, c := range body.Status.Conditions {
				got = append(got, c.Type)
				if !c.LastHeartbeatTime.Time.Equal(tc.now) {
					t.Errorf("%s heartbeat = %v, want %v", c.Type, c.LastHeartbeatTime, tc.now)
				}
			}
			if len(got) != len(tc.wantConds) {
				t.Errorf("conditions in patch = %v, want %v", got, tc.wantConds)
			}
			for i := range min(len(got), len(tc.wantConds)) {
				if got[i] != tc.wantConds[i] {
					t.Errorf("conditions in patch = %v, want %v", got, tc.wantConds)
				}
			}
			if (body.Status.NodeInfo != nil) != tc.wantInfo {
				t.Errorf("nodeInfo in patch: %v, want %v", body.Status.NodeInfo != nil, tc.wantInfo)
			}
			if (body.Status.Capacity != nil) != tc.wantCapacity {
				t.Errorf("capacity in patch: %v, want %v", body.Status.Capacity != nil, tc.wantCapacity)
			}

			// Applied, the patch leaves nothing to do and keeps others' data.
			after := applyStatus(t, n, p)
			if again, _ := StatusPatch(after, testHost, tc.now, time.Minute); again != nil {
				t.Errorf("after applying, StatusPatch = %s, want nothing", again)
			}
			if c := findCondition(after.Status.Conditions, v1.NodeNetworkUnavailable); c == nil || c.Reason != "RouteCreated" {
				t.Errorf("NetworkUnavailable after patch = %+v, want it untouched", c)
			}
			ready := findCondition(after.Status.Conditions, v1.NodeReady)
			if tc.keepTransition && !ready.LastTransitionTime.Time.Equal(t0) {
				t.Errorf("Ready transition = %v, want %v (status did not change)", ready.LastTransitionTime, t0)
			}
		})
	}
}

func TestRenewedLease(t *testing.T) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "uid-1"}}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	l := RenewedLease(nil, node, now)
	if l.Namespace != NodeLeaseNamespace || l.Name != "node-1" || *l.Spec.HolderIdentity != "node-1" ||
		*l.Spec.LeaseDurationSeconds != 40 || !l.Spec.RenewTime.Time.Equal(now) {
		t.Errorf("new lease = %+v", l)
	}
	if len(l.OwnerReferences) != 1 || l.OwnerReferences[0].UID != "uid-1" || l.OwnerReferences[0].Kind != "Node" {
		t.Errorf("owner = %+v", l.OwnerReferences)
	}

	cur := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Namespace: NodeLeaseNamespace, ResourceVersion: "7"}}
	node2 := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "uid-2"}} // registered again
	l = RenewedLease(cur, node2, now.Add(10*time.Second))
	if l.ResourceVersion != "7" || l.OwnerReferences[0].UID != "uid-2" || !l.Spec.RenewTime.Time.Equal(now.Add(10*time.Second)) {
		t.Errorf("renewed lease = %+v", l)
	}
	if cur.Spec.RenewTime != nil {
		t.Error("RenewedLease modified its input")
	}
}
