package e2e

import (
	"testing"
	"time"
)

// TestLBFaultsLeaderKilled: two replicas with leader election as shipped.
// The leader is SIGKILLed; the VIP keeps being answered, always with the
// same MAC (the other replica stands in from the host's neighbour record,
// then leads and places the VIP where the old leader had it).
func TestLBFaultsLeaderKilled(t *testing.T) {
	requireEnv(t)
	cfg := lbCloudConfig("10.88.0.64-10.88.0.67")
	first := startCCM(t, cfg, lbControllers)
	servicesGoneAtEnd(t, "ha-")
	macs := lbNodes(t, "e2e-ha", 2)
	client := newLANClient(t, "10.88.0.9/24")
	createLBService(t, "ha-web", nil)
	vip, _ := waitVIP(t, "ha-web", 30*time.Second)
	answering := waitNodeARP(t, client, vip, macs, 10*time.Second)
	second := startCCM(t, cfg, lbControllers)
	// The first replica is dead by the end: the Services' finalizers can
	// only go while the second (by then the leader) still runs, and
	// cleanups run last registered first.
	servicesGoneAtEnd(t, "ha-")
	time.Sleep(3 * time.Second) // the second replica is up and standing by

	capture := client.capture(t)
	probe := probeARP(t, client, vip, macs[answering])
	time.Sleep(2 * time.Second)
	start := time.Now()
	first.proc.Kill()
	// The second replica takes the lease after the 15 s lease expires.
	time.Sleep(25 * time.Second)
	probe.end()
	sent, missed, wrong := probe.counts()
	t.Logf("leader SIGKILLed: %d ARP probes at 5/s over %s, %d unanswered, other MACs %v",
		sent, time.Since(start).Round(time.Second), missed, wrong)
	if missed != 0 || len(wrong) != 0 {
		t.Errorf("VIP %s across leader failover: %d of %d probes unanswered, other MACs %v", vip, missed, sent, wrong)
	}
	if macsSeen := capture.answerMACs(vip); len(macsSeen) != 1 {
		t.Errorf("answers for %s came with MACs %v, want only %s", vip, macsSeen, macs[answering])
	}
	if second.proc.Exited() {
		t.Fatal("the second replica exited")
	}
}
