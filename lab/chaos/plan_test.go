package chaos

import (
	"fmt"
	"slices"
	"testing"
)

func planFaults(seed int64, nodes []string, n int) []string {
	p := NewPlan(seed, nodes, nil)
	var out []string
	for range n {
		f := p.Next()
		out = append(out, fmt.Sprintf("%s gap %s", f, f.Gap))
	}
	return out
}

func TestPlanIsReproducible(t *testing.T) {
	nodes := []string{"lab-node-1", "lab-node-2"}
	a, b := planFaults(7, nodes, 200), planFaults(7, nodes, 200)
	if !slices.Equal(a, b) {
		t.Fatal("the same seed gave two sequences")
	}
	if c := planFaults(8, nodes, 200); slices.Equal(a, c) {
		t.Error("seeds 7 and 8 gave the same sequence")
	}
}

func TestPlanCoversEveryKindWithinBounds(t *testing.T) {
	nodes := []string{"lab-node-1", "lab-node-2"}
	hosts := []string{"lab-host2", "lab-host3"}
	p := NewPlan(1, nodes, hosts)
	kinds := map[FaultKind]int{}
	live := map[string]bool{}
	for i := range 300 {
		f := p.Next()
		kinds[f.Kind]++
		pol := f.Kind.policy()
		if f.Hold < pol.holdMin || f.Hold > pol.holdMax {
			t.Errorf("fault %d %s: hold %s outside [%s, %s]", i, f, f.Hold, pol.holdMin, pol.holdMax)
		}
		switch f.Kind {
		case FaultNodeStop, FaultNodeKill:
			if !slices.Contains(nodes, f.Node) {
				t.Errorf("fault %d %s: not a lab node", i, f)
			}
		case FaultHostLoss:
			if !slices.Contains(hosts, f.Host) {
				t.Errorf("fault %d %s: not a host that may be lost", i, f)
			}
		case FaultLibvirtd:
			if f.Signal != "TERM" && f.Signal != "KILL" {
				t.Errorf("fault %d %s: signal %q", i, f, f.Signal)
			}
		case FaultServiceCreate:
			for _, s := range f.Create {
				if live[s.Key()] {
					t.Errorf("fault %d creates %s twice", i, s.Key())
				}
				live[s.Key()] = true
			}
		case FaultServiceDelete:
			if !live[f.Delete.Key()] {
				t.Errorf("fault %d deletes %s, which is not live", i, f.Delete.Key())
			}
			delete(live, f.Delete.Key())
		}
		if len(live) > maxServices+1 { // a pair may take the count one past the bound
			t.Fatalf("fault %d: %d Services live, bound %d", i, len(live), maxServices)
		}
	}
	for _, k := range FaultKinds() {
		if kinds[k] == 0 {
			t.Errorf("no %s in 300 faults: %v", k, kinds)
		}
	}
}

func TestPlanStartsWithServices(t *testing.T) {
	p := NewPlan(3, []string{"a", "b"}, nil)
	first, second := p.Next(), p.Next()
	if first.Kind != FaultServiceCreate || len(first.Create) != 2 || first.Create[0].SharingKey == "" || first.Create[0].SharingKey != first.Create[1].SharingKey {
		t.Errorf("first fault %s, want a pair of Services sharing a key", first)
	}
	if second.Kind != FaultServiceCreate || len(second.Create) != 1 {
		t.Errorf("second fault %s, want one Service", second)
	}
}

func TestPlanStopsNoNodeOfAOneNodeLab(t *testing.T) {
	p := NewPlan(5, []string{"lab-node-1"}, nil)
	for i := range 200 {
		if f := p.Next(); f.Kind.isNode() {
			t.Fatalf("fault %d %s stops the only node", i, f)
		}
	}
}

// A lab of one host has no host to lose: the first runs the control plane.
func TestPlanLosesNoHostOfAOneHostLab(t *testing.T) {
	p := NewPlan(5, []string{"lab-node-1", "lab-node-2"}, nil)
	for i := range 300 {
		if f := p.Next(); f.Kind == FaultHostLoss {
			t.Fatalf("fault %d %s in a lab of one host", i, f)
		}
	}
}

// Losing the leader's host loses the leader: judged as ccm-kill is, an
// outage with its lease's settle bound, and reported beside the drawn kinds.
func TestLeaderHostLossIsJudgedAsTheLeadersLoss(t *testing.T) {
	got, want := FaultLeaderHostLoss.policy(), FaultCCMKill.policy()
	if !got.Outage || got.Settle != want.Settle || got.weight != 0 {
		t.Errorf("host-loss-leader policy %+v, want an undrawn outage settling within %s", got, want.Settle)
	}
	if !slices.Contains(reportedKinds(), FaultLeaderHostLoss) || slices.Contains(FaultKinds(), FaultLeaderHostLoss) {
		t.Errorf("host-loss-leader must be reported but never drawn")
	}
	if !FaultLeaderHostLoss.isNode() {
		t.Errorf("host-loss-leader takes nodes down: it must wait for every node first")
	}
}
