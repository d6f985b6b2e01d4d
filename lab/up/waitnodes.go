package up

import (
	"context"
	"fmt"
	"maps"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/host"
)

// WaitNodes waits up to Wait until the lab's nodes are done (Ready and
// initialized by the CCM (providerID), with a pod CIDR whose route is on
// the bridge), or a first one is, printing progress as it changes. On
// timeout it names, per node not done, what that node lacks.
type WaitNodes struct {
	Cluster *Cluster
	Wait    time.Duration
	First   bool // one node done is enough
}

func (a *WaitNodes) Execute(ctx context.Context, env *Env) error {
	client, st, timeout := a.Cluster.Client, env.State, a.Wait
	enough := labProgress.done
	if a.First {
		enough = labProgress.anyDone
	}
	var (
		last    labProgress // from the last check that could read everything
		lastErr error       // of the last check, nil when it could
		printed string
	)
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var p labProgress
		p, lastErr = labReady(ctx, client, st)
		msg := p.String()
		if lastErr != nil {
			msg = lastErr.Error()
		} else {
			last = p
		}
		if msg != printed && (lastErr != nil || !enough(p)) {
			env.say("waiting: %s", msg)
		}
		printed = msg
		return lastErr == nil && enough(p), nil
	})
	if err != nil && ctx.Err() == nil {
		return labTimeoutError(timeout, last, lastErr)
	}
	return err
}

// labTimeoutError says what the lab's nodes still lack after timeout,
// from the last check that could read everything, and why the last check
// could not if it could not.
func labTimeoutError(timeout time.Duration, last labProgress, lastErr error) error {
	summary := ""
	if last != nil {
		summary = last.String()
	}
	return waitTimeoutError("lab", timeout, summary, last.missing(), lastErr, "labcloud logs NODE for a guest's console, labcloud logs ccm")
}

// labReady judges the lab's nodes from the API server's Nodes and the
// CCM's routes on the bridge.
func labReady(ctx context.Context, client kubernetes.Interface, st *lab.State) (labProgress, error) {
	routes, err := host.PodCIDRRoutes("", lab.Bridge)
	if err != nil {
		return nil, fmt.Errorf("routes on %s: %w", lab.Bridge, err)
	}
	if st.Routed { // each host routes its own nodes' pod CIDRs
		for _, h := range st.LabHosts()[1:] {
			theirs, err := host.PodCIDRRoutes(h.Netns, lab.Bridge)
			if err != nil {
				return nil, fmt.Errorf("routes on %s's %s: %w", h.Name, lab.Bridge, err)
			}
			maps.Copy(routes, theirs)
		}
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Nodes: %w", err)
	}
	// One pod CIDR of each of the cluster's families, each routed.
	return judgeLab(st.Nodes, nodes.Items, len(st.Addressing.Of(st.IPFamily).ClusterCIDRs()), routes), nil
}
