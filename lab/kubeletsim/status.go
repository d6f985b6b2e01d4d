// Package kubeletsim is what light mode's simulated kubelets report: the
// Node a kubelet with --cloud-provider=external registers (uninitialized
// taint, system UUID, no providerID), its status, and its heartbeat Lease.
package kubeletsim

import (
	"runtime"
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

// labels are the labels a kubelet sets on its Node; all of them are
// allowed to a node by NodeRestriction.
func labels(nodeName string) map[string]string {
	return map[string]string{
		v1.LabelHostname:   nodeName,
		v1.LabelOSStable:   runtime.GOOS,
		v1.LabelArchStable: runtime.GOARCH,
	}
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

// NewNode is the Node the simulated kubelet creates: a kubelet's labels, the
// uninitialized taint, no providerID (the cloud-controller-manager sets it)
// and a full status, so the cloud-controller-manager sees the system UUID
// from the first event.
func NewNode(name string, host Host, now time.Time) *v1.Node {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: labels(name),
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
