// Package kubeletsim is what light mode's simulated kubelets report: the
// Node a kubelet with --cloud-provider=external registers (uninitialized
// taint, system UUID, no providerID), its status, and its heartbeat Lease.
package kubeletsim

import (
	"encoding/json"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// UninitializedTaint is the taint a kubelet with --cloud-provider=external
// registers its Node with; the cloud-controller-manager removes it.
var UninitializedTaint = v1.Taint{
	Key:    "node.cloudprovider.kubernetes.io/uninitialized",
	Value:  "true",
	Effect: v1.TaintEffectNoSchedule,
}

// NodeLeaseNamespace holds the node heartbeat Leases.
const NodeLeaseNamespace = "kube-node-lease"

// Host describes a simulated node's machine, as reported in Node status.
type Host struct {
	// SystemUUID is the SMBIOS product UUID, lowercased (libvirt sets it to
	// the domain UUID).
	SystemUUID string
	BootID     string
	MachineID  string
	// KernelVersion is uname -r.
	KernelVersion string
	// CPUs and MemoryBytes become the Node's capacity.
	CPUs        int
	MemoryBytes int64
}

// KubeletVersion is reported as status.nodeInfo.kubeletVersion: the
// Kubernetes minor this client matches, marked as simulated.
const KubeletVersion = "v1.36.3-simulated"

func (h Host) nodeInfo() v1.NodeSystemInfo {
	return v1.NodeSystemInfo{
		MachineID:               h.MachineID,
		SystemUUID:              h.SystemUUID,
		BootID:                  h.BootID,
		KernelVersion:           h.KernelVersion,
		OSImage:                 "labcloud simulated node",
		ContainerRuntimeVersion: "none://",
		KubeletVersion:          KubeletVersion,
		OperatingSystem:         runtime.GOOS,
		Architecture:            runtime.GOARCH,
	}
}

// capacity is what the Node offers. the simulated kubelet runs no pods, so it offers
// none: nothing is ever scheduled onto a node that cannot run it.
func (h Host) capacity() v1.ResourceList {
	return v1.ResourceList{
		v1.ResourceCPU:    *resource.NewQuantity(int64(h.CPUs), resource.DecimalSI),
		v1.ResourceMemory: *resource.NewQuantity(h.MemoryBytes, resource.BinarySI),
		v1.ResourcePods:   *resource.NewQuantity(0, resource.DecimalSI),
	}
}

// DefaultLabels are the labels a kubelet sets on its Node; all of them are
// allowed to a node by NodeRestriction.
func DefaultLabels(nodeName string) map[string]string {
	return map[string]string{
		v1.LabelHostname:   nodeName,
		v1.LabelOSStable:   runtime.GOOS,
		v1.LabelArchStable: runtime.GOARCH,
	}
}

// wantLabels merges the default labels with the configured ones; the
// defaults win.
func wantLabels(nodeName string, extra map[string]string) map[string]string {
	out := maps.Clone(extra)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, DefaultLabels(nodeName))
	return out
}

// conditionSpec is one node condition the simulated kubelet reports.
type conditionSpec struct {
	Type    v1.NodeConditionType
	Status  v1.ConditionStatus
	Reason  string
	Message string
}

// conditions are the conditions the simulated kubelet owns, in the order a kubelet
// reports them. NetworkUnavailable belongs to the route controller.
var conditions = []conditionSpec{
	{v1.NodeMemoryPressure, v1.ConditionFalse, "KubeletHasSufficientMemory", "the simulated kubelet has sufficient memory available"},
	{v1.NodeDiskPressure, v1.ConditionFalse, "KubeletHasNoDiskPressure", "the simulated kubelet has no disk pressure"},
	{v1.NodePIDPressure, v1.ConditionFalse, "KubeletHasSufficientPID", "the simulated kubelet has sufficient PID available"},
	{v1.NodeReady, v1.ConditionTrue, "KubeletReady", "the simulated kubelet is posting ready status"},
}

// NewNode is the Node the simulated kubelet creates: default and configured labels, the
// uninitialized taint, no providerID (the cloud-controller-manager sets it)
// and a full status, so the cloud-controller-manager sees the system UUID
// from the first event.
func NewNode(name string, labels map[string]string, host Host, now time.Time) *v1.Node {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: wantLabels(name, labels),
		},
		Spec: v1.NodeSpec{
			Taints: []v1.Taint{UninitializedTaint},
		},
	}
	node.Status.NodeInfo = host.nodeInfo()
	node.Status.Capacity = host.capacity()
	node.Status.Allocatable = host.capacity()
	t := metav1.NewTime(now)
	for _, c := range conditions {
		node.Status.Conditions = append(node.Status.Conditions, v1.NodeCondition{
			Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message,
			LastHeartbeatTime: t, LastTransitionTime: t,
		})
	}
	return node
}

// LabelPatch is the strategic merge patch that adds missing or different
// wanted labels to an existing Node, or nil when nothing is to be done. It
// never removes labels and never touches taints (NodeRestriction forbids a
// node to change its own taints).
func LabelPatch(node *v1.Node, labels map[string]string) ([]byte, error) {
	want := wantLabels(node.Name, labels)
	diff := map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if v, ok := node.Labels[k]; !ok || v != want[k] {
			diff[k] = want[k]
		}
	}
	if len(diff) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": diff}})
	if err != nil {
		return nil, fmt.Errorf("encode label patch: %w", err)
	}
	return b, nil
}

type statusPatch struct {
	Status statusPatchBody `json:"status"`
}

type statusPatchBody struct {
	Conditions  []v1.NodeCondition `json:"conditions,omitempty"`
	NodeInfo    *v1.NodeSystemInfo `json:"nodeInfo,omitempty"`
	Capacity    v1.ResourceList    `json:"capacity,omitempty"`
	Allocatable v1.ResourceList    `json:"allocatable,omitempty"`
}

// StatusPatch is the strategic merge patch for nodes/status that brings the
// observed Node to what the simulated kubelet reports, or nil when nothing is due:
//   - Ready is refreshed (new heartbeat) when it is older than refresh, or
//     when it is not True/KubeletReady (say the node lifecycle controller set
//     it Unknown);
//   - the pressure conditions only when they are missing or wrong;
//   - nodeInfo, capacity and allocatable only when they differ.
//
// Conditions merge by type, so conditions owned by others (NetworkUnavailable)
// are left alone. A condition keeps its lastTransitionTime while its status
// does not change.
func StatusPatch(node *v1.Node, host Host, now time.Time, refresh time.Duration) ([]byte, error) {
	var body statusPatchBody
	t := metav1.NewTime(now)
	for _, c := range conditions {
		cur := findCondition(node.Status.Conditions, c.Type)
		due := cur == nil || cur.Status != c.Status || cur.Reason != c.Reason || cur.Message != c.Message
		if c.Type == v1.NodeReady && cur != nil && now.Sub(cur.LastHeartbeatTime.Time) >= refresh {
			due = true
		}
		if !due {
			continue
		}
		transition := t
		if cur != nil && cur.Status == c.Status && !cur.LastTransitionTime.IsZero() {
			transition = cur.LastTransitionTime
		}
		body.Conditions = append(body.Conditions, v1.NodeCondition{
			Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message,
			LastHeartbeatTime: t, LastTransitionTime: transition,
		})
	}
	info := host.nodeInfo()
	cur := node.Status.NodeInfo
	cur.Swap = nil
	if cur != info {
		body.NodeInfo = &info
	}
	capacity := host.capacity()
	if !sameResources(node.Status.Capacity, capacity) || !sameResources(node.Status.Allocatable, capacity) {
		body.Capacity = capacity
		body.Allocatable = capacity
	}
	if body.Conditions == nil && body.NodeInfo == nil && body.Capacity == nil {
		return nil, nil
	}
	b, err := json.Marshal(statusPatch{Status: body})
	if err != nil {
		return nil, fmt.Errorf("encode status patch: %w", err)
	}
	return b, nil
}

func findCondition(cs []v1.NodeCondition, t v1.NodeConditionType) *v1.NodeCondition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}

// sameResources says whether have holds every quantity in want, equal.
// Extra resources in have (added by others) do not matter.
func sameResources(have, want v1.ResourceList) bool {
	for k, q := range want {
		h, ok := have[k]
		if !ok || h.Cmp(q) != 0 {
			return false
		}
	}
	return true
}

// LeaseDuration is the lease duration the simulated kubelet declares, as a kubelet does.
const LeaseDuration = 40 * time.Second

// RenewedLease returns the Lease to write: a copy of cur (nil to create one)
// held by the node, renewed at now and owned by the Node object, so the
// garbage collector removes it with the Node.
func RenewedLease(cur *coordinationv1.Lease, node *v1.Node, now time.Time) *coordinationv1.Lease {
	var l *coordinationv1.Lease
	if cur != nil {
		l = cur.DeepCopy()
	} else {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node.Name, Namespace: NodeLeaseNamespace}}
	}
	l.Spec.HolderIdentity = ptr.To(node.Name)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(LeaseDuration / time.Second))
	l.Spec.RenewTime = &metav1.MicroTime{Time: now}
	if node.UID != "" {
		l.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: "v1",
			Kind:       "Node",
			Name:       node.Name,
			UID:        node.UID,
		}}
	}
	return l
}
