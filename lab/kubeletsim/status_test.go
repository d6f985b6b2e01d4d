package kubeletsim

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	n := NewNode("node-1", testHost, now)
	if n.Spec.ProviderID != "" {
		t.Errorf("providerID = %q, want none (the CCM sets it)", n.Spec.ProviderID)
	}
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0] != UninitializedTaint {
		t.Errorf("taints = %v, want only %v", n.Spec.Taints, UninitializedTaint)
	}
	wantLabels := map[string]string{
		v1.LabelHostname: "node-1", v1.LabelOSStable: "linux", v1.LabelArchStable: "amd64",
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
	ready := 0
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			ready++
			if c.Status != v1.ConditionTrue || c.Reason != "KubeletReady" || !c.LastHeartbeatTime.Time.Equal(now) {
				t.Errorf("Ready condition = %+v, want True, KubeletReady, heartbeat %v", c, now)
			}
		}
	}
	if ready != 1 {
		t.Errorf("%d Ready conditions in %+v, want one", ready, n.Status.Conditions)
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
