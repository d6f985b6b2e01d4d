package labe2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/labcloud/labcloud/lab"
)

// checkRestored brings the lab of TestLab's shape up again, after its
// down: up restores the snapshot its first up took, and the restored
// cluster is a working one. Its nodes keep time with the host (their
// kubelets renew their Leases at the host's time, though the snapshot is
// minutes old); a new Deployment answers through a new VIP; a node whose
// QEMU is killed gets the out-of-service taint and comes back when
// started again. A second restore of the same snapshot works too. args
// are the first up's.
func checkRestored(t *testing.T, l *labcloud, args ...string) {
	t.Helper()
	for round := 1; round <= 2; round++ {
		start := time.Now()
		out := l.must(10*time.Minute, append([]string{"up"}, args...)...)
		if !strings.Contains(out, "restored from snapshot") {
			t.Fatalf("up %d after the first lab's down did not restore its snapshot:\n%s", round, out)
		}
		t.Logf("restore %d: labcloud up took %s (%s)", round, time.Since(start).Round(10*time.Millisecond), lastLine(out, "lab up in"))
		for _, n := range l.status().Nodes {
			if !strings.HasPrefix(n.ProviderID, "libvirt://") || n.Ready != "True" || n.DomainState != "running" {
				t.Errorf("restore %d: node %s not initialized/ready/running: %+v", round, n.Name, n)
			}
		}
		eventually(t, "every restored node renewing its Lease at the host's time", time.Minute, time.Second, func() string {
			got, err := l.kubectl(30*time.Second, "get", "leases", "-n", "kube-node-lease", "-o", `jsonpath={range .items[*]}{.spec.renewTime}{"\n"}{end}`)
			if err != nil {
				return err.Error()
			}
			for _, line := range strings.Fields(got) {
				at, err := time.Parse(time.RFC3339Nano, line)
				if err != nil || time.Since(at).Abs() > 20*time.Second {
					return fmt.Sprintf("renewTime %s (now %s)", line, time.Now().UTC().Format(time.RFC3339))
				}
			}
			return ""
		})
		if round == 2 {
			break
		}
		// The Service after the pods: its answer is then the nodes'
		// kube-proxies and the CCM, which a fresh lab gives in well under
		// a second; a kube-proxy still watching through a connection of
		// before the restore would not see the Service for up to 45 s.
		l.mustKubectl("create", "deployment", "restored", "--image=registry.k8s.io/e2e-test-images/agnhost:2.63.0", "--replicas=2", "--", "/agnhost", "netexec", "--http-port=8080")
		l.mustKubectl("rollout", "status", "deployment/restored", "--timeout=5m")
		l.mustKubectl("expose", "deployment", "restored", "--type=LoadBalancer", "--port=80", "--target-port=8080")
		exposed := time.Now()
		vip := ""
		eventually(t, "a new Service on the restored lab answering through its VIP", 15*time.Second, 200*time.Millisecond, func() string {
			vip, _ = l.kubectl(30*time.Second, "get", "svc", "restored", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}")
			if vip == "" {
				return "no VIP"
			}
			got, err := l.curl("http://" + vip + "/hostname")
			if err != nil || !strings.HasPrefix(got, "restored-") {
				return fmt.Sprintf("%q %v", got, err)
			}
			return ""
		})
		t.Logf("restore %d: a new Service answered through its VIP %s %.2fs after it was created", round, vip, time.Since(exposed).Seconds())
		node := l.status().Nodes[0].Name
		l.must(time.Minute, "node", "stop", node)
		eventually(t, node+" tainted out-of-service after its domain stopped", time.Minute, time.Second, func() string {
			taints, _ := l.kubectl(30*time.Second, "get", "node", node, "-o", "jsonpath={.spec.taints[*].key}")
			if !strings.Contains(taints, "node.kubernetes.io/out-of-service") {
				return "taints: " + taints
			}
			return ""
		})
		started := time.Now()
		l.must(time.Minute, "node", "start", node)
		eventually(t, node+" booted again, Ready with a fresh Lease", 4*time.Minute, 2*time.Second, func() string {
			renew, _ := l.kubectl(30*time.Second, "get", "lease", "-n", "kube-node-lease", node, "-o", "jsonpath={.spec.renewTime}")
			at, err := time.Parse(time.RFC3339Nano, renew)
			if err != nil || at.Before(started.Add(20*time.Second)) {
				return "renewTime " + renew
			}
			return ""
		})
		l.must(5*time.Minute, "down")
	}
	// A snapshot that cannot be restored is removed, and up boots the lab
	// (and takes a whole snapshot again): never a half-restored cluster.
	st, err := lab.LoadState(l.dir)
	if err != nil || st.Snapshot == "" {
		t.Fatalf("the restored lab's state names no snapshot: %v", err)
	}
	l.must(5*time.Minute, "down")
	if err := os.Truncate(filepath.Join(lab.Snapshots().Path(st.Snapshot), "lab-node-1.mem"), 1<<20); err != nil {
		t.Fatal(err)
	}
	out := l.must(15*time.Minute, append([]string{"up"}, args...)...)
	if !strings.Contains(out, "the restore failed") || strings.Contains(out, "restored from snapshot") || !strings.Contains(out, "snapshot for the next up done") {
		t.Errorf("up from a damaged snapshot: want the restore to fail, the lab booted and a new snapshot taken:\n%s", out)
	}
	for _, n := range l.status().Nodes {
		if n.Ready != "True" || n.DomainState != "running" {
			t.Errorf("after the damaged snapshot: node %s not ready/running: %+v", n.Name, n)
		}
	}
}

// lastLine is the last line of out that starts with prefix.
func lastLine(out, prefix string) string {
	found := ""
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), prefix) {
			found = strings.TrimSpace(line)
		}
	}
	return found
}
