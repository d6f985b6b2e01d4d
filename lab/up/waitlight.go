package up

import (
	"context"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/explain"
)

// WaitLight waits until every node of the light lab is registered,
// initialized by the CCM and Ready, printing progress at most every 2 s.
// On timeout it names, per node not done, what that node lacks.
type WaitLight struct {
	Cluster *Cluster
	Wait    time.Duration
}

func (a *WaitLight) Execute(ctx context.Context, env *Env) error {
	client, names, timeout := a.Cluster.Client, env.State.Nodes, a.Wait
	total := len(names)
	var cur, printed lightProgress
	var printedAt time.Time
	var last *v1.NodeList // the last that could be read
	var lastErr error     // of the last List
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		// From the API server's watch cache: cheap even for thousands.
		list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if lastErr = err; err != nil {
			return false, nil
		}
		last = list
		cur = countLight(list.Items)
		if cur.initialized == total && cur.ready == total {
			env.say("%s", cur)
			return true, nil
		}
		if cur != printed && time.Since(printedAt) >= 2*time.Second {
			env.say("waiting: %s of %d", cur, total)
			printed, printedAt = cur, time.Now()
		}
		return false, nil
	})
	if err != nil && ctx.Err() == nil {
		return lightTimeoutError(timeout, names, last, lastErr)
	}
	return err
}

// lightProgress counts the light lab's nodes by how far they got.
type lightProgress struct{ registered, initialized, ready int }

func (p lightProgress) String() string {
	return fmt.Sprintf("%d registered, %d initialized (providerID, zone, no uninitialized taint), %d Ready", p.registered, p.initialized, p.ready)
}

func countLight(nodes []v1.Node) lightProgress {
	var p lightProgress
	for i := range nodes {
		n := &nodes[i]
		p.registered++
		if len(lightUninitialized(n)) == 0 {
			p.initialized++
		}
		if nodeIsReady(n) {
			p.ready++
		}
	}
	return p
}

const uninitializedTaint = "node.cloudprovider.kubernetes.io/uninitialized"

// lightUninitialized names what the CCM has yet to do to the light lab's
// Node n: none when it is initialized.
func lightUninitialized(n *v1.Node) []string {
	var out []string
	if n.Spec.ProviderID == "" {
		out = append(out, "no providerID")
	}
	if z := n.Labels[v1.LabelTopologyZone]; z != lab.LightZone {
		out = append(out, fmt.Sprintf("zone %q, want %q", z, lab.LightZone))
	}
	if tainted(n, uninitializedTaint) {
		out = append(out, "still tainted "+uninitializedTaint)
	}
	return out
}

// lightLacks names, for each of the light lab's nodes (names) not yet
// registered, initialized and Ready, what it lacks.
func lightLacks(names []string, nodes []v1.Node) []nodeLacks {
	byName := nodesByName(nodes)
	var out []nodeLacks
	for _, name := range names {
		n := byName[name]
		if n == nil {
			out = append(out, nodeLacks{node: name, lacks: []string{"not registered (no Node; the simulator's log says why)"}})
			continue
		}
		var lacks []string
		if why := explain.NodeNotReady(n); why != "" {
			lacks = append(lacks, "not Ready ("+why+")")
		}
		if un := lightUninitialized(n); len(un) > 0 {
			lacks = append(lacks, "not initialized by the CCM: "+strings.Join(un, ", "))
		}
		if len(lacks) > 0 {
			out = append(out, nodeLacks{node: name, lacks: lacks})
		}
	}
	return out
}

// lightTimeoutError says what the light lab's nodes (names) still lack
// after timeout, from the last List that could be read, and why the last
// List failed if it did.
func lightTimeoutError(timeout time.Duration, names []string, last *v1.NodeList, lastErr error) error {
	summary, lacks := "", []nodeLacks(nil)
	if last != nil {
		summary, lacks = fmt.Sprintf("%s of %d", countLight(last.Items), len(names)), lightLacks(names, last.Items)
	}
	if lastErr != nil {
		lastErr = fmt.Errorf("list Nodes: %w", lastErr)
	}
	return waitTimeoutError("light lab", timeout, summary, lacks, lastErr, "labcloud logs simulator, labcloud logs ccm")
}

func tainted(n *v1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

func nodeIsReady(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}
