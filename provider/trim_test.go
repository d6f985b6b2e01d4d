package provider

import (
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/diff"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

func someManagedFields() []metav1.ManagedFieldsEntry {
	return []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate,
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:images":{}}}`)}}}
}

// trimmed node: what the CCM reads survives, what it never reads is gone.
func TestTrimForCache(t *testing.T) {
	node := func(full bool) *v1.Node {
		n := &v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: "7",
				Labels:      map[string]string{v1.LabelNodeExcludeBalancers: "", "kubernetes.io/hostname": "n1"},
				Annotations: map[string]string{"alpha.kubernetes.io/provided-node-ip": "10.0.0.5"}},
			Spec: v1.NodeSpec{ProviderID: "libvirt://x", PodCIDRs: []string{"10.244.1.0/24"},
				Taints: []v1.Taint{{Key: "node.cloudprovider.kubernetes.io/uninitialized", Effect: v1.TaintEffectNoSchedule}}},
			Status: v1.NodeStatus{
				Addresses:  []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.0.0.5"}},
				Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}},
				NodeInfo:   v1.NodeSystemInfo{SystemUUID: "0f0e"},
				Capacity:   v1.ResourceList{},
			},
		}
		if full {
			n.ManagedFields = someManagedFields()
			n.Status.Images = []v1.ContainerImage{{Names: []string{"registry.k8s.io/pause:3.10.2"}, SizeBytes: 1}}
			n.Status.VolumesInUse = []v1.UniqueVolumeName{"v"}
			n.Status.VolumesAttached = []v1.AttachedVolume{{Name: "v", DevicePath: "/dev/x"}}
		}
		return n
	}
	svc := func(full bool) *v1.Service {
		s := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default",
				Annotations: map[string]string{"lb.labcloud.io/ip": "10.0.0.200", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
				Finalizers:  []string{"service.kubernetes.io/load-balancer-cleanup"}},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal},
			Status: v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: "10.0.0.200"}}},
				Conditions: []metav1.Condition{{Type: "Announced", Status: metav1.ConditionTrue}}},
		}
		if full {
			s.ManagedFields = someManagedFields()
		}
		return s
	}
	slice := func(full bool) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: "web-abc", Namespace: "default",
				Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.5"}, NodeName: ptr.To("n1"),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		}
		if full {
			s.ManagedFields = someManagedFields()
			s.Endpoints[0].TargetRef = &v1.ObjectReference{Kind: "Pod", Name: "web-1", Namespace: "default"}
			s.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z"}}}
			s.Endpoints[0].DeprecatedTopology = map[string]string{"topology.kubernetes.io/zone": "z"}
		}
		return s
	}
	gone := cache.DeletedFinalStateUnknown{Key: "n1", Obj: node(true)}
	for _, tc := range []struct {
		name    string
		in, out any
	}{
		{"node", node(true), node(false)},
		{"node already trimmed", node(false), node(false)},
		{"service", svc(true), svc(false)},
		{"endpointslice", slice(true), slice(false)},
		// A tombstone is handed on as it is: it holds a cached (already
		// trimmed) object and is no metav1.Object itself.
		{"tombstone", gone, cache.DeletedFinalStateUnknown{Key: "n1", Obj: node(true)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := TrimForCache(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(tc.out, got) {
				t.Errorf("trimmed (-want +got):\n%s", diff.Diff(tc.out, got))
			}
			again, _ := TrimForCache(got)
			if !reflect.DeepEqual(tc.out, again) {
				t.Errorf("not idempotent (-want +got):\n%s", diff.Diff(tc.out, again))
			}
		})
	}
}

// managedFields must become nil, not empty: an Update carrying an empty
// list would wipe the server's field ownership.
func TestTrimForCacheManagedFieldsNil(t *testing.T) {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ManagedFields: someManagedFields()}}
	if _, err := TrimForCache(n); err != nil {
		t.Fatal(err)
	}
	if n.ManagedFields != nil {
		t.Fatalf("managedFields = %#v, want nil", n.ManagedFields)
	}
}
