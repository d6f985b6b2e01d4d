package e2e

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestLBFaultsLibvirtdRestart: libvirtd stops (its guests keep running)
// while Node events arrive, and comes back. The VIP is answered through
// all of it, by the same node, and no Node is deleted.
func TestLBFaultsLibvirtdRestart(t *testing.T) {
	requireEnv(t)
	startCCM(t, lbCloudConfig("10.88.0.60-10.88.0.63"), lbControllers)
	servicesGoneAtEnd(t, "lvd-")
	macs := lbNodes(t, "e2e-lvd", 2)
	client := newLANClient(t, "10.88.0.8/24")
	createLBService(t, "lvd-web", nil)
	vip, _ := waitVIP(t, "lvd-web", 30*time.Second)
	answering := waitNodeARP(t, client, vip, macs, 10*time.Second)
	probe := probeARP(t, client, vip, macs[answering])

	env.daemon.StopLibvirtd()
	restarted := false
	defer func() {
		if !restarted {
			_ = env.daemon.StartLibvirtd(context.Background())
		}
	}()
	time.Sleep(time.Second)
	// Node events while the hypervisor cannot be asked.
	for i := range 5 {
		for name := range macs {
			n, err := env.admin.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("node %s gone while libvirtd was down: %v", name, err)
			}
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			n.Labels["lbfaults"] = time.Now().Format("150405") + string(rune('a'+i))
			if _, err := env.admin.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("update node %s: %v", name, err)
			}
		}
		time.Sleep(time.Second)
	}
	if err := env.daemon.StartLibvirtd(context.Background()); err != nil {
		t.Fatal(err)
	}
	restarted = true
	var err error
	if env.virt, err = reconnect(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // reconnect, resync, one placement pass
	probe.end()
	sent, missed, wrong := probe.counts()
	t.Logf("libvirtd restart: %d ARP probes at 5/s, %d unanswered, %d answered by another MAC (%v)", sent, missed, len(wrong), wrong)
	if missed != 0 || len(wrong) != 0 {
		t.Errorf("VIP %s lost across a libvirtd restart: %d of %d probes unanswered, other MACs %v", vip, missed, sent, wrong)
	}
	for name := range macs {
		if _, err := env.admin.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{}); err != nil {
			t.Errorf("node %s deleted across the libvirtd restart: %v", name, err)
		}
	}
}
