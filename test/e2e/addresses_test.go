package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A NotReady Node named unlike its domain, with no system UUID, known only
// by its InternalIP (the contract's last lookup), of a domain whose lease
// the CCM has not read yet: it is initialized, not deleted.
func TestNodeMatchedByAddressIsNotDeleted(t *testing.T) {
	requireEnv(t)
	startCCM(t, libvirtCloudConfig())
	// The domain gets its lease after the CCM read the leases at start.
	uuid, mac := defineDomain(t, "e2e-byaddr", true)
	ip := waitLease(t, mac)
	// Registered with its address and NotReady in one write, as a kubelet
	// with --node-ip registers: a Node first seen with neither could
	// rightly be deleted by the lifecycle controller's next pass.
	now := metav1.Now()
	createNodeWithStatus(t, "worker-by-address", v1.NodeStatus{
		Addresses:  []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip}},
		Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionFalse, Reason: "E2E", LastHeartbeatTime: now, LastTransitionTime: now}},
	})

	n := waitNode(t, "worker-by-address", "initialization by address", 30*time.Second, func(n *v1.Node) bool {
		return n == nil || n.Spec.ProviderID != ""
	})
	if n == nil {
		t.Fatal("the Node of a running domain, known by its address, was deleted")
	}
	if n.Spec.ProviderID != "libvirt://"+uuid {
		t.Fatalf("providerID = %q, want libvirt://%s", n.Spec.ProviderID, uuid)
	}
	// The lifecycle controller asks about NotReady Nodes every 5 s.
	deadline := time.Now().Add(12 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := env.admin.CoreV1().Nodes().Get(context.Background(), "worker-by-address", metav1.GetOptions{}); err != nil {
			t.Fatalf("the Node was deleted: %v", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// addressSources: [arp]: the host's permanent neighbour entry for a VIP,
// pointing at a node's MAC (what the announcer writes), is not that node's
// address; the entry learned from the guest is.
func TestARPSourceIgnoresPermanentEntries(t *testing.T) {
	requireEnv(t)
	_, mac := defineDomain(t, "e2e-arp", true)
	ip := waitLease(t, mac)
	const vip = "10.88.0.33"
	for _, args := range [][]string{
		{"neigh", "replace", ip, "lladdr", mac, "dev", env.bridge, "nud", "reachable"},
		{"neigh", "replace", vip, "lladdr", mac, "dev", env.bridge, "nud", "permanent"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() { _ = exec.Command("ip", "neigh", "del", vip, "dev", env.bridge).Run() })
	startCCM(t, fmt.Sprintf("region: e2e\nhypervisors: [{uri: 'qemu:///system', zone: e2e-zone}]\nnetworks: [%s]\naddressSources: [arp]\n", env.network))
	createNode(t, "e2e-arp", v1.ConditionTrue)
	n := waitNode(t, "e2e-arp", "initialization", 30*time.Second, func(n *v1.Node) bool {
		return n != nil && !hasTaint(n, uninitializedTaint) && len(n.Status.Addresses) > 1
	})
	var internal []string
	for _, a := range n.Status.Addresses {
		if a.Type == v1.NodeInternalIP {
			internal = append(internal, a.Address)
		}
	}
	if len(internal) != 1 || internal[0] != ip {
		t.Fatalf("InternalIPs = %v, want only %s (the guest's), never the VIP %s", internal, ip, vip)
	}
}
