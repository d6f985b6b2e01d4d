package e2e

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestLBFaultsLeaderKilled: two replicas with leader election as shipped.
// The leader is SIGKILLed; the VIP keeps being answered, always with the
// same MAC (the other replica stands in from the host's neighbour record,
// then leads and places the VIP where the old leader had it).
func TestLBFaultsLeaderKilled(t *testing.T) {
	requireEnv(t)
	r := startReplicas(t, "ha", "10.88.0.64-10.88.0.67", "10.88.0.9/24")
	first, second, client, vip, macs, answering := r.first, r.second, r.client, r.vip, r.macs, r.answering

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
	if macsSeen := capture.AnswerMACs(vip, time.Time{}); len(macsSeen) != 1 {
		t.Errorf("answers for %s came with MACs %v, want only %s", vip, macsSeen, macs[answering])
	}
	if second.proc.Exited() {
		t.Fatal("the second replica exited")
	}
}

// replicas is two CCM replicas as shipped over two nodes, with a LAN client
// and one LoadBalancer Service answered by a node.
type replicas struct {
	first, second *ccm // first leads
	client        *lanClient
	vip           netip.Addr
	macs          map[string]net.HardwareAddr
	answering     string // the node answering vip
}

// startReplicas starts the first replica, nodes e2e-PREFIX-1 and -2, a LAN
// client at clientCIDR and the Service PREFIX-web with a VIP from pool, then
// the second replica, and lets it stand by.
func startReplicas(t *testing.T, prefix, pool, clientCIDR string) replicas {
	t.Helper()
	cfg := lbCloudConfig(pool)
	r := replicas{first: startCCM(t, cfg, lbControllers)}
	servicesGoneAtEnd(t, prefix+"-")
	r.macs = lbNodes(t, "e2e-"+prefix, 2)
	r.client = newLANClient(t, clientCIDR)
	createLBService(t, prefix+"-web", nil)
	r.vip, _ = waitVIP(t, prefix+"-web", 30*time.Second)
	r.answering = waitNodeARP(t, r.client, r.vip, r.macs, 10*time.Second)
	r.second = startCCM(t, cfg, lbControllers)
	// The first replica may be dead by the end: the Services' finalizers
	// can only go while the second still runs, and cleanups run last
	// registered first.
	servicesGoneAtEnd(t, prefix+"-")
	time.Sleep(3 * time.Second) // the second replica is up and standing by
	return r
}
