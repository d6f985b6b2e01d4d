package labe2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/procfs"
	v1 "k8s.io/api/core/v1"

	"github.com/labcloud/labcloud/lab"
)

// lightNodes lists the light lab's Nodes with kubectl in the lab.
func (l *labcloud) lightNodes() []v1.Node {
	l.t.Helper()
	out := l.must(2*time.Minute, "exec", "--", "kubectl", "get", "nodes", "-o", "json")
	var list v1.NodeList
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		l.t.Fatalf("kubectl get nodes: %v\n%.2000s", err, out)
	}
	return list.Items
}

// checkInitialized reports every Node the CCM has not initialized from the
// test driver: providerID, region and zone labels, no uninitialized taint.
func checkInitialized(t *testing.T, nodes []v1.Node, want int) {
	t.Helper()
	if len(nodes) != want {
		t.Errorf("%d Nodes, want %d", len(nodes), want)
	}
	bad := 0
	for _, n := range nodes {
		var why []string
		if !strings.HasPrefix(n.Spec.ProviderID, "libvirt://") {
			why = append(why, "providerID "+n.Spec.ProviderID)
		}
		if n.Labels[v1.LabelTopologyZone] != "lab-host" || n.Labels[v1.LabelTopologyRegion] != "lab" {
			why = append(why, fmt.Sprintf("zone %q region %q", n.Labels[v1.LabelTopologyZone], n.Labels[v1.LabelTopologyRegion]))
		}
		for _, taint := range n.Spec.Taints {
			if taint.Key == "node.cloudprovider.kubernetes.io/uninitialized" {
				why = append(why, "still tainted uninitialized")
			}
		}
		if len(why) > 0 {
			if bad++; bad <= 5 {
				t.Errorf("node %s not initialized: %s", n.Name, strings.Join(why, "; "))
			}
		}
	}
	if bad > 5 {
		t.Errorf("... %d nodes not initialized in all", bad)
	}
}

// memory reads a process's current and peak resident set sizes in MiB.
func memory(pid int) (rss, peak float64, err error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, 0, err
	}
	st, err := p.NewStatus()
	if err != nil {
		return 0, 0, err
	}
	return float64(st.VmRSS) / (1 << 20), float64(st.VmHWM) / (1 << 20), nil
}

func stepSeconds(st *lab.State, prefix string) float64 {
	for _, s := range st.Steps {
		if strings.HasPrefix(s.Name, prefix) {
			return s.Seconds
		}
	}
	return -1
}

// upLight brings a light lab of n nodes up and returns its state and how
// long the simulator took from its start to every node initialized.
func (l *labcloud) upLight(n int) (*lab.State, float64) {
	l.t.Helper()
	start := time.Now()
	out := l.must(15*time.Minute, "up", "--light", "--nodes", strconv.Itoa(n))
	l.t.Logf("labcloud up --light --nodes %d took %s:\n%s", n, time.Since(start).Round(100*time.Millisecond), out)
	st, err := lab.LoadState(l.dir)
	if err != nil {
		l.t.Fatal(err)
	}
	if !st.Light || len(st.Nodes) != n || st.Pids[lab.SimulatorPid] == 0 {
		l.t.Fatalf("state is not a light lab of %d nodes with a simulator: light %v, %d nodes, pids %v", n, st.Light, len(st.Nodes), st.Pids)
	}
	return st, stepSeconds(st, "simulator of") + stepSeconds(st, "nodes registered, initialized")
}

func TestLabLight(t *testing.T) {
	l := newLabcloud(t)
	const n = 200
	st, initSeconds := l.upLight(n)
	t.Logf("light lab: %d nodes registered and initialized %.1fs after the simulator started", n, initSeconds)

	checkInitialized(t, l.lightNodes(), n)
	s := l.status()
	if len(s.Nodes) != n {
		t.Fatalf("status shows %d nodes, want %d", len(s.Nodes), n)
	}
	for _, ns := range s.Nodes[:3] {
		if ns.DomainState != "running" || ns.Ready != "True" || ns.PodCIDR == "" || len(ns.Addresses) == 0 {
			t.Errorf("status of %s: %+v", ns.Name, ns)
		}
	}
	// Heartbeats keep every node Ready beyond the first lease renewals.
	time.Sleep(15 * time.Second)
	ready := 0
	for _, node := range l.lightNodes() {
		for _, c := range node.Status.Conditions {
			if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue {
				ready++
			}
		}
	}
	if ready != n {
		t.Errorf("%d of %d nodes Ready 15 s after up", ready, n)
	}
	l.downTwiceLeavesNothing(st.Pids)
}

// TestLabLightScale measures a light lab of 1000 nodes: how long until all
// are initialized, and the CCM's memory.
func TestLabLightScale(t *testing.T) {
	l := newLabcloud(t)
	const n = 1000
	st, initSeconds := l.upLight(n)
	checkInitialized(t, l.lightNodes(), n)
	ccm := st.Pids["libvirt-cloud-controller-manager"]
	rss, peak, err := memory(ccm)
	if err != nil {
		t.Fatalf("CCM memory: %v", err)
	}
	t.Logf("MEASURED light lab, %d nodes: all initialized %.1fs after the simulator started; CCM RSS %.1f MiB (peak %.1f MiB)", n, initSeconds, rss, peak)
	for _, name := range []string{"kube-apiserver", "etcd", "kube-controller-manager", lab.SimulatorPid} {
		if r, p, err := memory(st.Pids[name]); err == nil {
			t.Logf("MEASURED %s RSS %.1f MiB (peak %.1f MiB)", name, r, p)
		}
	}
	l.downTwiceLeavesNothing(st.Pids)
}
