package e2e

import (
	"syscall"
	"testing"
	"time"
)

// TestLBFaultsAPIServerOutage: two replicas with leader election as
// shipped; the API server stops answering for 60 s (SIGSTOP: connections
// hang, as with a dead control-plane host). The leader cannot renew its
// lease and exits (upstream's behaviour); the other replica stands in from
// the host's neighbour record, so every ARP probe is answered, always with
// the same MAC. When the API server is back the standing replica leads and
// serves new Services by itself.
func TestLBFaultsAPIServerOutage(t *testing.T) {
	requireEnv(t)
	var apiserver int
	for _, p := range env.cp.Processes() {
		if p.Name == "kube-apiserver" {
			apiserver = p.Pid()
		}
	}
	if apiserver == 0 {
		t.Fatal("no kube-apiserver process in the control plane")
	}
	r := startReplicas(t, "outage", "10.88.0.68-10.88.0.71", "10.88.0.10/24")
	first, second, client, vip, macs, answering := r.first, r.second, r.client, r.vip, r.macs, r.answering

	capture := client.capture(t)
	probe := probeARP(t, client, vip, macs[answering])
	time.Sleep(2 * time.Second)
	if err := syscall.Kill(apiserver, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(apiserver, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	time.Sleep(60 * time.Second)
	resume()
	time.Sleep(5 * time.Second)
	probe.end()
	sent, missed, wrong := probe.counts()
	t.Logf("API server stopped 60 s: %d ARP probes at 5/s, %d unanswered, other MACs %v; leader exited: %v",
		sent, missed, wrong, first.proc.Exited())
	if missed != 0 || len(wrong) != 0 {
		t.Errorf("VIP %s across a 60 s API server outage: %d of %d probes unanswered, other MACs %v", vip, missed, sent, wrong)
	}
	if macsSeen := capture.answerMACs(vip); len(macsSeen) != 1 {
		t.Errorf("answers for %s came with MACs %v, want only %s", vip, macsSeen, macs[answering])
	}
	if second.proc.Exited() {
		t.Fatalf("the standing replica exited:\n%s", second.proc.Tail(20))
	}

	// Recovered by itself: a replica leads again and a new Service gets a
	// VIP that is answered.
	createLBService(t, "outage-after", nil)
	after, _ := waitVIP(t, "outage-after", 60*time.Second)
	waitNodeARP(t, client, after, macs, 10*time.Second)
}
