package up

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/explain"
)

// What a wait of up says when it times out: per node that is not done,
// what it still lacks, so that a CI log names the missing piece instead of
// a count (peers' tools that only count or hang: talos#5548,
// kubevirtci#1783).

// nodeProgress is how far one lab node got: registered, Ready,
// initialized by the CCM, given its pod CIDRs and their routes.
type nodeProgress struct {
	name        string
	registered  bool
	notReady    string // why it is not Ready, "" when it is
	initialized bool   // the CCM gave it a providerID
	podCIDRs    []string
	wantCIDRs   int      // one per family of the cluster
	unrouted    []string // its pod CIDRs with no route on the bridge
}

// judgeLabNode says how far the lab node name got. n is its Node, nil
// when it is not registered; routes are the CCM's routes on the bridge by
// destination CIDR.
func judgeLabNode(name string, n *v1.Node, wantCIDRs int, routes map[string]string) nodeProgress {
	p := nodeProgress{name: name, wantCIDRs: wantCIDRs}
	if n == nil {
		return p
	}
	p.registered = true
	p.notReady = explain.NodeNotReady(n)
	p.initialized = n.Spec.ProviderID != ""
	p.podCIDRs = lab.PodCIDRs(n)
	for _, c := range p.podCIDRs {
		if _, ok := routes[c]; !ok {
			p.unrouted = append(p.unrouted, c)
		}
	}
	return p
}

func (p nodeProgress) readyAndInitialized() bool {
	return p.registered && p.notReady == "" && p.initialized
}

func (p nodeProgress) hasPodCIDRs() bool { return p.registered && len(p.podCIDRs) == p.wantCIDRs }

func (p nodeProgress) routed() bool { return p.hasPodCIDRs() && len(p.unrouted) == 0 }

func (p nodeProgress) done() bool { return p.readyAndInitialized() && p.routed() }

// lacks names what the node still lacks, in the order a node gains them.
func (p nodeProgress) lacks() []string {
	if !p.registered {
		return []string{"not registered (no Node; its console says why)"}
	}
	var out []string
	if p.notReady != "" {
		out = append(out, "not Ready ("+p.notReady+")")
	}
	if !p.initialized {
		out = append(out, "no providerID (not initialized by the CCM)")
	}
	switch {
	case len(p.podCIDRs) == 0:
		out = append(out, "no pod CIDR (kube-controller-manager allocates it)")
	case len(p.podCIDRs) != p.wantCIDRs:
		out = append(out, fmt.Sprintf("%d pod CIDRs (%s), want one per family: %d", len(p.podCIDRs), strings.Join(p.podCIDRs, ", "), p.wantCIDRs))
	}
	for _, c := range p.unrouted {
		out = append(out, "pod CIDR "+c+" without its route on the bridge (the CCM's route controller adds it)")
	}
	return out
}

// labProgress is how far each of the lab's nodes got, in node order.
type labProgress []nodeProgress

// judgeLab judges every node the lab booted (names) from the Nodes the API
// server holds and the CCM's routes on the bridge by destination CIDR.
func judgeLab(names []string, nodes []v1.Node, wantCIDRs int, routes map[string]string) labProgress {
	byName := nodesByName(nodes)
	out := make(labProgress, 0, len(names))
	for _, name := range names {
		out = append(out, judgeLabNode(name, byName[name], wantCIDRs, routes))
	}
	return out
}

func (l labProgress) done() bool {
	for _, p := range l {
		if !p.done() {
			return false
		}
	}
	return true
}

// anyDone says whether some node is done.
func (l labProgress) anyDone() bool {
	return slices.ContainsFunc(l, nodeProgress.done)
}

// String counts the nodes at each stage: the progress line of up.
func (l labProgress) String() string {
	var registered, initialized, cidrs, routed int
	for _, p := range l {
		registered += count(p.registered)
		initialized += count(p.readyAndInitialized())
		cidrs += count(p.hasPodCIDRs())
		routed += count(p.routed())
	}
	total := len(l)
	return fmt.Sprintf("%d/%d registered, %d/%d Ready+initialized, %d/%d pod CIDRs, %d/%d routes", registered, total, initialized, total, cidrs, total, routed, total)
}

// missing names each node not done, in node order, with what it lacks.
func (l labProgress) missing() []nodeLacks {
	var out []nodeLacks
	for _, p := range l {
		if !p.done() {
			out = append(out, nodeLacks{node: p.name, lacks: p.lacks()})
		}
	}
	return out
}

func count(b bool) int {
	if b {
		return 1
	}
	return 0
}

// nodesByName indexes nodes by name.
func nodesByName(nodes []v1.Node) map[string]*v1.Node {
	byName := make(map[string]*v1.Node, len(nodes))
	for i := range nodes {
		byName[nodes[i].Name] = &nodes[i]
	}
	return byName
}

// waitTimeoutError is what a wait for the nodes of lab says after timeout:
// summary and lacks from the last check that could read everything ("" and
// nil if none could), why the last check failed if it did, and where the
// logs are.
func waitTimeoutError(lab string, timeout time.Duration, summary string, lacks []nodeLacks, lastErr error, logs string) error {
	msg := fmt.Sprintf("%s not ready after %s (--wait)", lab, timeout)
	if summary != "" {
		msg += ": " + summary + formatLacks(lacks)
	}
	if lastErr != nil {
		msg += "\n  the last check failed: " + lastErr.Error()
	}
	return errors.New(msg + "\n  (logs: " + logs + "; the logs export holds both)")
}

// nodeLacks is what one node still lacks, in words.
type nodeLacks struct {
	node  string
	lacks []string
}

// maxLacksLines bounds the nodes a timeout names: a light lab of
// thousands stuck on one cause would otherwise bury it.
const maxLacksLines = 10

// formatLacks writes one indented line per node, at most maxLacksLines,
// then how many more there are.
func formatLacks(nodes []nodeLacks) string {
	var b strings.Builder
	for i, n := range nodes {
		if i == maxLacksLines {
			fmt.Fprintf(&b, "\n  ... and %d more nodes", len(nodes)-i)
			break
		}
		fmt.Fprintf(&b, "\n  %s: %s", n.node, strings.Join(n.lacks, "; "))
	}
	return b.String()
}
