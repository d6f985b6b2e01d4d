package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// The CCM's informers cache trimmed Nodes (provider.TrimForCache), and the
// cloud-node controller initializes a Node with Update() of its cached
// copy: nothing the cache dropped, nor any annotation or label, may be lost
// on the server by that write, and the other writers' field ownership
// (managedFields) must survive it.
func TestInitializationKeepsWhatTheCacheDrops(t *testing.T) {
	requireEnv(t)
	fixture := writeFixture(t, "keep", 1)
	startCCM(t, fmt.Sprintf("region: e2e\nhypervisors: [{uri: 'test://%s', zone: e2e}]\naddressSources: [dhcp-leases]\n", fixture))
	ctx := context.Background()
	const name = "keep-0000"
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels:      map[string]string{"example.com/kept": "label"},
			Annotations: map[string]string{"example.com/kept": "annotation"}},
		Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: uninitializedTaint, Value: "true", Effect: v1.TaintEffectNoSchedule}}},
	}
	_, err := env.admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{FieldManager: "kubelet-e2e"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.admin.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	// What a kubelet reports and the cache drops: images and volumes. The
	// CCM or kube-controller-manager may write the Node meanwhile: retried
	// on conflict, as a kubelet does.
	images := []v1.ContainerImage{{Names: []string{"registry.k8s.io/pause:3.10.2"}, SizeBytes: 320000}}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := env.admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Images = images
		n.Status.VolumesInUse = []v1.UniqueVolumeName{"kubernetes.io/csi/e2e^vol"}
		now := metav1.Now()
		n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
		_, err = env.admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{FieldManager: "kubelet-e2e"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	got := waitNode(t, name, "initialization", 60*time.Second, func(n *v1.Node) bool {
		return n != nil && n.Spec.ProviderID != "" && !hasTaint(n, uninitializedTaint)
	})
	if got.Labels["example.com/kept"] != "label" || got.Annotations["example.com/kept"] != "annotation" {
		t.Errorf("labels %v, annotations %v: the initialization dropped ours", got.Labels, got.Annotations)
	}
	if len(got.Status.Images) != 1 || got.Status.Images[0].Names[0] != images[0].Names[0] || len(got.Status.VolumesInUse) != 1 {
		t.Errorf("images %v, volumes in use %v: the initialization dropped them", got.Status.Images, got.Status.VolumesInUse)
	}
	managers := map[string]bool{}
	for _, m := range got.ManagedFields {
		managers[m.Manager] = true
	}
	if !managers["kubelet-e2e"] {
		t.Errorf("managedFields %v: the kubelet's ownership is gone", managers)
	}
}
