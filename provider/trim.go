package provider

import (
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
)

// TrimForCache is the transform of the CCM's shared informers
// (informers.WithTransform): it drops what no controller of the CCM reads
// before an object is cached, so that 1000 Nodes and Services cost what
// their useful fields cost.
//
// What may go is bounded by how the controllers write: the cloud-node
// controller initializes a Node with Update() of its cached copy, so the
// Node's metadata and spec must stay whole (an annotation missing from the
// cache would be deleted on the server). Status is safe to trim: Update
// ignores a Node's status, and status is only written as a patch computed
// between two cached copies, which lack the same fields. managedFields is
// set to nil, not emptied: a write without managedFields keeps the
// server's, as kube-controller-manager's own transform relies on.
//
//   - every object: metadata.managedFields;
//   - Node: status.images (a real node lists every image it holds, names
//     and sizes: often the largest part of a Node), volumesInUse and
//     volumesAttached;
//   - EndpointSlice: each endpoint's targetRef, hints and deprecated
//     topology (placement reads nodeName and the ready condition only).
//
// Services are cached whole but for managedFields: the service controller
// compares annotations between versions, and the load balancer reads its
// own lb.labcloud.io/* annotations and the status.
//
// It mutates obj in place, which client-go allows (the transform sees each
// object before anyone else), and is idempotent.
func TrimForCache(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil && m.GetManagedFields() != nil {
		m.SetManagedFields(nil)
	}
	switch o := obj.(type) {
	case *v1.Node:
		o.Status.Images = nil
		o.Status.VolumesInUse = nil
		o.Status.VolumesAttached = nil
	case *discoveryv1.EndpointSlice:
		for i := range o.Endpoints {
			o.Endpoints[i].TargetRef = nil
			o.Endpoints[i].Hints = nil
			o.Endpoints[i].DeprecatedTopology = nil
		}
	}
	return obj, nil
}
