package up

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/labcloud/labcloud/lab"
)

// labNode is a Node of the lab for judgeLab's table: Ready, initialized,
// with the pod CIDRs given, as changed by each option.
func labNode(name string, cidrs []string, opts ...func(*v1.Node)) v1.Node {
	n := v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.NodeSpec{ProviderID: "libvirt://" + name, PodCIDRs: cidrs},
		Status:     v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady"}}},
	}
	if len(cidrs) > 0 {
		n.Spec.PodCIDR = cidrs[0]
	}
	for _, o := range opts {
		o(&n)
	}
	return n
}

func notReady(reason, message string) func(*v1.Node) {
	return func(n *v1.Node) {
		n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionFalse, Reason: reason, Message: message}}
	}
}

func noProviderID(n *v1.Node) { n.Spec.ProviderID = "" }

func TestJudgeLab(t *testing.T) {
	routes := map[string]string{"10.244.0.0/24": "10.123.0.11", "fd00:10:244::/64": "fd00:10:123::101"}
	for _, tt := range []struct {
		name      string
		node      *v1.Node // nil: not registered
		wantCIDRs int
		done      bool
		lacks     []string // substrings of the lacks, in order
		counts    string
	}{
		{name: "done", node: ptr.To(labNode("n", []string{"10.244.0.0/24"})), wantCIDRs: 1, done: true,
			counts: "1/1 registered, 1/1 Ready+initialized, 1/1 pod CIDRs, 1/1 routes"},
		{name: "done, dual-stack", node: ptr.To(labNode("n", []string{"10.244.0.0/24", "fd00:10:244::/64"})), wantCIDRs: 2, done: true,
			counts: "1/1 registered, 1/1 Ready+initialized, 1/1 pod CIDRs, 1/1 routes"},
		{name: "not registered", wantCIDRs: 1, lacks: []string{"not registered"},
			counts: "0/1 registered, 0/1 Ready+initialized, 0/1 pod CIDRs, 0/1 routes"},
		{name: "not Ready", wantCIDRs: 1,
			node:   ptr.To(labNode("n", []string{"10.244.0.0/24"}, notReady("KubeletNotReady", "container runtime network not ready: NetworkReady=false\ncni plugin not initialized"))),
			lacks:  []string{"not Ready (KubeletNotReady: container runtime network not ready: NetworkReady=false cni plugin not initialized)"},
			counts: "1/1 registered, 0/1 Ready+initialized, 1/1 pod CIDRs, 1/1 routes"},
		{name: "status unknown", wantCIDRs: 1,
			node: ptr.To(labNode("n", []string{"10.244.0.0/24"}, func(n *v1.Node) {
				n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionUnknown}}
			})),
			lacks: []string{"not Ready (Ready is Unknown)"}},
		{name: "no Ready condition", wantCIDRs: 1,
			node:  ptr.To(labNode("n", []string{"10.244.0.0/24"}, func(n *v1.Node) { n.Status.Conditions = nil })),
			lacks: []string{"not Ready (no Ready condition yet)"}},
		{name: "not initialized", wantCIDRs: 1, node: ptr.To(labNode("n", []string{"10.244.0.0/24"}, noProviderID)),
			lacks:  []string{"no providerID (not initialized by the CCM)"},
			counts: "1/1 registered, 0/1 Ready+initialized, 1/1 pod CIDRs, 1/1 routes"},
		{name: "no pod CIDR", wantCIDRs: 1, node: ptr.To(labNode("n", nil)),
			lacks:  []string{"no pod CIDR"},
			counts: "1/1 registered, 1/1 Ready+initialized, 0/1 pod CIDRs, 0/1 routes"},
		{name: "one family of two", wantCIDRs: 2, node: ptr.To(labNode("n", []string{"10.244.0.0/24"})),
			lacks: []string{"1 pod CIDRs (10.244.0.0/24), want one per family: 2"}},
		{name: "unrouted", wantCIDRs: 2, node: ptr.To(labNode("n", []string{"10.244.0.0/24", "fd00:10:244:1::/64"})),
			lacks:  []string{"pod CIDR fd00:10:244:1::/64 without its route on the bridge"},
			counts: "1/1 registered, 1/1 Ready+initialized, 1/1 pod CIDRs, 0/1 routes"},
		{name: "everything at once", wantCIDRs: 1,
			node:  ptr.To(labNode("n", []string{"10.244.9.0/24"}, notReady("KubeletNotReady", "PLEG is not healthy"), noProviderID)),
			lacks: []string{"not Ready (KubeletNotReady: PLEG is not healthy)", "no providerID", "pod CIDR 10.244.9.0/24 without its route"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var nodes []v1.Node
			if tt.node != nil {
				nodes = append(nodes, *tt.node)
			}
			got := judgeLab([]string{"n"}, nodes, tt.wantCIDRs, routes)
			if got.done() != tt.done {
				t.Errorf("done() = %v, want %v", got.done(), tt.done)
			}
			if tt.counts != "" && got.String() != tt.counts {
				t.Errorf("String() = %q, want %q", got, tt.counts)
			}
			missing := got.missing()
			if tt.done {
				if len(missing) != 0 {
					t.Errorf("missing() = %+v for a node that is done", missing)
				}
				return
			}
			if len(missing) != 1 || missing[0].node != "n" {
				t.Fatalf("missing() = %+v, want node n alone", missing)
			}
			lacks := missing[0].lacks
			if len(lacks) != len(tt.lacks) {
				t.Fatalf("lacks = %q, want %d like %q", lacks, len(tt.lacks), tt.lacks)
			}
			for i, want := range tt.lacks {
				if !strings.Contains(lacks[i], want) {
					t.Errorf("lack %d = %q, want it to say %q", i, lacks[i], want)
				}
			}
		})
	}
}

// TestAnyDone: the first answer's pod is created once one node is done,
// and only then; a registered node that is not Ready is not enough.
func TestAnyDone(t *testing.T) {
	routes := map[string]string{"10.244.0.0/24": "10.123.0.11", "10.244.1.0/24": "10.123.0.12"}
	names := []string{"a", "b", "c"}
	for _, tt := range []struct {
		name  string
		nodes []v1.Node
		want  bool
	}{
		{"no Node yet", nil, false},
		{"registered, not Ready", []v1.Node{labNode("a", []string{"10.244.0.0/24"}, notReady("KubeletNotReady", "PLEG"))}, false},
		{"Ready, not initialized", []v1.Node{labNode("a", []string{"10.244.0.0/24"}, noProviderID)}, false},
		{"Ready, unrouted", []v1.Node{labNode("a", []string{"10.244.7.0/24"})}, false},
		{"one done of three", []v1.Node{labNode("b", []string{"10.244.1.0/24"}), labNode("a", nil)}, true},
		{"a Node not the lab's", []v1.Node{labNode("other", []string{"10.244.0.0/24"})}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := judgeLab(names, tt.nodes, 1, routes)
			if got.anyDone() != tt.want {
				t.Errorf("anyDone() = %v, want %v (%s)", got.anyDone(), tt.want, got)
			}
			if got.done() {
				t.Errorf("done() with at most one of three nodes: %s", got)
			}
		})
	}
}

// TestJudgeLabNamesOnlyTheLabsNodes: a Node that is none of the lab's
// counts for nothing, and nodes are judged in the lab's order.
func TestJudgeLabNamesOnlyTheLabsNodes(t *testing.T) {
	nodes := []v1.Node{labNode("other", nil), labNode("lab-node-2", nil, noProviderID), labNode("lab-node-1", []string{"10.244.0.0/24"})}
	got := judgeLab([]string{"lab-node-1", "lab-node-2", "lab-node-3"}, nodes, 1, map[string]string{"10.244.0.0/24": "10.123.0.11"})
	if want := "2/3 registered, 1/3 Ready+initialized, 1/3 pod CIDRs, 1/3 routes"; got.String() != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	var names []string
	for _, m := range got.missing() {
		names = append(names, m.node)
	}
	if want := []string{"lab-node-2", "lab-node-3"}; !slices.Equal(names, want) {
		t.Errorf("missing() names %q, want %q", names, want)
	}
}

func TestLabTimeoutError(t *testing.T) {
	last := judgeLab([]string{"lab-node-1", "lab-node-2"}, []v1.Node{labNode("lab-node-1", []string{"10.244.0.0/24"}, notReady("KubeletNotReady", "cni plugin not initialized"))}, 1, nil)
	got := labTimeoutError(5*time.Minute, last, errors.New("list Nodes: connection refused")).Error()
	for _, want := range []string{
		"lab not ready after 5m0s (--wait): 1/2 registered, 0/2 Ready+initialized, 1/2 pod CIDRs, 0/2 routes\n",
		"\n  lab-node-1: not Ready (KubeletNotReady: cni plugin not initialized); pod CIDR 10.244.0.0/24 without its route on the bridge",
		"\n  lab-node-2: not registered",
		"\n  the last check failed: list Nodes: connection refused\n",
		"labcloud logs NODE",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("error does not say %q:\n%s", want, got)
		}
	}
	if got := labTimeoutError(time.Minute, nil, errors.New("routes on labbr0: no such device")).Error(); !strings.HasPrefix(got, "lab not ready after 1m0s (--wait)\n  the last check failed: routes on") {
		t.Errorf("with no check that read everything, error = %q", got)
	}
}

func TestFormatLacksIsBounded(t *testing.T) {
	var nodes []nodeLacks
	for i := range 25 {
		name, _ := lab.LightNode(i+1, 25)
		nodes = append(nodes, nodeLacks{node: name, lacks: []string{"not registered"}})
	}
	got := formatLacks(nodes)
	if lines := strings.Count(got, "\n"); lines != maxLacksLines+1 {
		t.Errorf("%d lines, want %d:%s", lines, maxLacksLines+1, got)
	}
	if !strings.HasSuffix(got, "\n  ... and 15 more nodes") {
		t.Errorf("formatLacks does not end with how many more:%s", got)
	}
}
