package e2e

import (
	"context"
	"slices"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	nodeutil "k8s.io/component-helpers/node/util"

	"github.com/labcloud/labcloud/provider/placement"
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
	// The probe goes on until every node has reported Ready again (their
	// "kubelets" report every 10 s, one by one, and kube-controller-manager
	// may mark them Unknown first), and 2 s more: the VIP must not move
	// while they come back.
	back := time.Now().Truncate(time.Second)
	var unknown []string
	for name := range macs {
		waitNode(t, name, "a Ready report after the outage", 60*time.Second, func(n *v1.Node) bool {
			_, c := nodeutil.GetNodeCondition(&n.Status, v1.NodeReady)
			if c != nil && c.Status == v1.ConditionUnknown && !slices.Contains(unknown, name) {
				unknown = append(unknown, name)
			}
			return c != nil && c.Status == v1.ConditionTrue && !c.LastHeartbeatTime.Time.Before(back)
		})
	}
	time.Sleep(2 * time.Second)
	probe.end()
	sent, missed, wrong := probe.counts()
	t.Logf("API server stopped 60 s: %d ARP probes at 5/s, %d unanswered, other MACs %v; leader exited: %v; Nodes seen Unknown after: %v",
		sent, missed, wrong, first.proc.Exited(), unknown)
	if missed != 0 || len(wrong) != 0 {
		t.Errorf("VIP %s across a 60 s API server outage: %d of %d probes unanswered, other MACs %v", vip, missed, sent, wrong)
	}
	if macsSeen := capture.AnswerMACs(vip, time.Time{}); len(macsSeen) != 1 {
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

// TestLBUnknownNodeKeepsItsVIP: after a control-plane outage
// kube-controller-manager marks every Node Unknown, and the kubelets report
// again one by one. The first node back Ready does not take the VIP of a
// node still Unknown whose domain runs; once placement.UnknownHold has
// passed with that node still Unknown, the Ready node takes it.
func TestLBUnknownNodeKeepsItsVIP(t *testing.T) {
	requireEnv(t)
	startCCM(t, lbCloudConfig("10.88.0.98-10.88.0.99"), lbControllers)
	servicesGoneAtEnd(t, "unknown-")
	macs := lbNodes(t, "e2e-unknown", 2)
	client := newLANClient(t, "10.88.0.13/24")
	createLBService(t, "unknown-web", nil)
	vip, _ := waitVIP(t, "unknown-web", 30*time.Second)
	answering := waitNodeARP(t, client, vip, macs, 10*time.Second)
	other := otherNode(macs, answering)

	unknownAt := time.Now().Truncate(time.Second) // the condition's time has whole seconds
	setReady(t, answering, v1.ConditionUnknown)
	setReady(t, other, v1.ConditionUnknown)
	setReady(t, other, v1.ConditionTrue)
	probe := probeARP(t, client, vip, macs[answering])
	time.Sleep(5 * time.Second)
	probe.end()
	if sent, missed, wrong := probe.counts(); missed != 0 || len(wrong) != 0 {
		t.Errorf("VIP %s while %s is Unknown and %s Ready again: %d of %d probes unanswered, other MACs %v, want all %s",
			vip, answering, other, missed, sent, wrong, macs[answering])
	}

	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, placement.UnknownHold+15*time.Second, true, func(context.Context) (bool, error) {
		mac, err := client.Resolve(vip, 300*time.Millisecond)
		return err == nil && mac.String() == macs[other].String(), nil
	})
	after := time.Since(unknownAt)
	t.Logf("VIP %s moved to the Ready node %s %v after %s went Unknown (hold %v)", vip, other, after.Round(100*time.Millisecond), answering, placement.UnknownHold)
	if err != nil {
		t.Fatalf("VIP %s still not answered by the Ready node %s %v after %s went Unknown", vip, other, after.Round(time.Second), answering)
	}
	if after < placement.UnknownHold {
		t.Errorf("VIP %s left the Unknown node %s after %v, before its %v hold", vip, answering, after, placement.UnknownHold)
	}
}
