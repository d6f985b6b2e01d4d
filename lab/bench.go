package lab

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// BenchResult is what `labcloud bench` measures on a running lab.
type BenchResult struct {
	UpSteps        []Step             `json:"upSteps"`
	UpTotalSeconds float64            `json:"upTotalSeconds"`
	Failovers      []FailoverRun      `json:"failovers"`
	FailoverP50    float64            `json:"failoverP50Seconds"`
	RSSMiB         map[string]float64 `json:"rssMiB"`
}

// FailoverRun is one domain stop → first HTTP answer from another node.
type FailoverRun struct {
	VIP     string  `json:"vip"`
	From    string  `json:"from"`
	To      string  `json:"to"`
	Seconds float64 `json:"seconds"`
}

// Bench measures VIP failover runs times and reads the daemons' memory.
// It runs inside the lab's namespace.
func Bench(ctx context.Context, st *State, runs int, out io.Writer) (*BenchResult, error) {
	client, err := adminClient(st.Kubeconfig)
	if err != nil {
		return nil, err
	}
	res := &BenchResult{UpSteps: st.Steps, RSSMiB: map[string]float64{}}
	for _, s := range st.Steps {
		// Building tools and waiting for another user of libvirtd are not the lab's own time.
		if !strings.HasPrefix(s.Name, "control-plane tools") && !strings.HasPrefix(s.Name, "build ") && !strings.HasPrefix(s.Name, "claim ") {
			res.UpTotalSeconds += s.Seconds
		}
	}
	const name = "labcloud-bench-failover"
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer,
			Ports: []v1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(80), Protocol: v1.ProtocolTCP}}},
	}
	if _, err := client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create bench Service: %w", err)
	}
	defer client.CoreV1().Services("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	vip, err := waitIngress(ctx, client, name)
	if err != nil {
		return nil, err
	}
	for i := 0; i < runs; i++ {
		run, err := failoverOnce(ctx, client, vip)
		if err != nil {
			return res, fmt.Errorf("failover run %d: %w", i+1, err)
		}
		fmt.Fprintf(out, "run %d: %s moved %s -> %s in %.3fs\n", i+1, run.VIP, run.From, run.To, run.Seconds)
		res.Failovers = append(res.Failovers, run)
	}
	secs := make([]float64, len(res.Failovers))
	for i, r := range res.Failovers {
		secs[i] = r.Seconds
	}
	slices.Sort(secs)
	if len(secs) > 0 {
		res.FailoverP50 = secs[len(secs)/2]
	}
	for name, pid := range st.Pids {
		if rss, err := rssMiB(pid); err == nil {
			res.RSSMiB[name] = rss
		}
	}
	return res, nil
}

func waitIngress(ctx context.Context, client kubernetes.Interface, name string) (string, error) {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		s, err := client.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
		if err == nil && len(s.Status.LoadBalancer.Ingress) > 0 {
			return s.Status.LoadBalancer.Ingress[0].IP, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return "", fmt.Errorf("service %s got no VIP in 60s", name)
}

// httpClient opens a new connection per request, as curl does: a kept-alive
// connection to the node that just died would stall the first probe.
var httpClient = &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}

// answer asks the VIP over HTTP; lab-node answers with its node name.
func answer(vip string) string {
	resp, err := httpClient.Get("http://" + vip + "/")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	return strings.TrimSpace(string(b))
}

func failoverOnce(ctx context.Context, client kubernetes.Interface, vip string) (FailoverRun, error) {
	var from string
	for deadline := time.Now().Add(60 * time.Second); from == "" && time.Now().Before(deadline); {
		if from = answer(vip); from == "" {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if from == "" {
		return FailoverRun{}, fmt.Errorf("VIP %s does not answer HTTP", vip)
	}
	start := time.Now()
	if err := NodeAction(from, "stop"); err != nil {
		return FailoverRun{}, err
	}
	run := FailoverRun{VIP: vip, From: from}
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if to := answer(vip); to != "" && to != from {
			run.To, run.Seconds = to, time.Since(start).Seconds()
			break
		}
	}
	restarted := time.Now()
	if err := NodeAction(from, "start"); err != nil {
		return run, err
	}
	if run.To == "" {
		return run, fmt.Errorf("VIP %s did not move off %s within 60s", vip, from)
	}
	// Let the restarted node come back Ready before the next run.
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		n, err := client.CoreV1().Nodes().Get(ctx, from, metav1.GetOptions{})
		// Ready as reported after the restart, not the stale condition from before.
		if err == nil && nodeIsReady(n) && !readySince(n).Before(restarted.Truncate(time.Second)) &&
			n.Spec.ProviderID != "" && !tainted(n, "node.cloudprovider.kubernetes.io/shutdown") {
			return run, nil
		}
	}
	return run, fmt.Errorf("node %s not Ready again within 3 minutes", from)
}

func readySince(n *v1.Node) time.Time {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.LastHeartbeatTime.Time
		}
	}
	return time.Time{}
}

func tainted(n *v1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

func rssMiB(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}
