package lb

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// announcer is the node that answers for vip among eligible: the first of
// its ranking, "" when none is eligible.
func announcer(vip netip.Addr, eligible []string) string {
	if best := Ranked(vip, eligible, 1); len(best) > 0 {
		return best[0]
	}
	return ""
}

func TestAnnouncer(t *testing.T) {
	vip := netip.MustParseAddr("192.168.50.10")
	// Which of n1/n2 the hash prefers for this VIP, so the table can say
	// "the other one" without hard-coding hash values.
	first := "n1"
	if hashOf(vip, "n2") > hashOf(vip, "n1") {
		first = "n2"
	}
	tests := []struct {
		name     string
		eligible []string
		want     string
	}{
		{name: "none eligible", eligible: nil, want: ""},
		{name: "only one", eligible: []string{"n3"}, want: "n3"},
		{name: "highest hash", eligible: []string{"n1", "n2"}, want: first},
		{name: "order does not matter", eligible: []string{"n2", "n1"}, want: first},
		{name: "duplicates harmless", eligible: []string{"n1", "n1"}, want: "n1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := announcer(vip, tt.eligible); got != tt.want {
				t.Errorf("announcer = %q, want %q", got, tt.want)
			}
		})
	}
	// The 4-in-6 form of a VIP is the same VIP.
	mapped := netip.AddrFrom16(vip.As16())
	if announcer(mapped, []string{"n1", "n2"}) != first {
		t.Error("a 4-in-6 VIP chose differently")
	}
}

func vips(n int) []netip.Addr {
	out := make([]netip.Addr, n)
	ip := netip.MustParseAddr("192.168.50.0")
	for i := range out {
		ip = ip.Next()
		out[i] = ip
	}
	return out
}

func nodeNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("node-%d", i+1)
	}
	return out
}

// TestAnnouncerSpreads: 3000 VIPs over 3 nodes with sequential names and
// addresses land within 10% of an even split.
func TestAnnouncerSpreads(t *testing.T) {
	for _, n := range []int{2, 3, 5} {
		nodes := nodeNames(n)
		load := map[string]int{}
		all := vips(3000)
		for _, vip := range all {
			load[announcer(vip, nodes)]++
		}
		even := len(all) / n
		for _, name := range nodes {
			if d := load[name] - even; d > even/10 || d < -even/10 {
				t.Errorf("%d nodes: load %v, want %d ±10%% each", n, load, even)
				break
			}
		}
	}
}

// TestAnnouncerMovesOnlyTheLostNodesVIPs: a node leaving moves exactly the
// VIPs it answered for, spread over the others; it coming back takes back
// exactly those.
func TestAnnouncerMovesOnlyTheLostNodesVIPs(t *testing.T) {
	nodes := nodeNames(4)
	all := vips(400)
	before := map[netip.Addr]string{}
	for _, vip := range all {
		before[vip] = announcer(vip, nodes)
	}
	lost := "node-2"
	rest := slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return n == lost })
	gained := map[string]int{}
	for _, vip := range all {
		after := announcer(vip, rest)
		if before[vip] != lost && after != before[vip] {
			t.Fatalf("%s moved from %s to %s though %s was lost", vip, before[vip], after, lost)
		}
		if before[vip] == lost {
			gained[after]++
		}
		if announcer(vip, nodes) != before[vip] {
			t.Fatalf("%s did not go back to %s when %s returned", vip, before[vip], lost)
		}
	}
	if len(gained) != len(rest) {
		t.Errorf("the lost node's VIPs went to %v, want spread over all %d others", gained, len(rest))
	}
}

func TestPlace(t *testing.T) {
	a, b, c := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::1")
	got := Place(map[netip.Addr][]string{a: {"n1", "n2", "n4"}, b: {"n3"}, c: nil}, 2)
	want := map[netip.Addr][]string{a: Ranked(a, []string{"n1", "n2", "n4"}, 2), b: {"n3"}}
	if len(got) != len(want) || !slices.Equal(got[a], want[a]) || !slices.Equal(got[b], want[b]) {
		t.Errorf("Place = %v, want %v", got, want)
	}
}

// TestRanked: the k best nodes in announcer's order, whatever the order of
// eligible and its duplicates; fewer when fewer are eligible.
func TestRanked(t *testing.T) {
	vip := netip.MustParseAddr("10.0.0.200")
	var nodes []string
	for i := range 50 {
		nodes = append(nodes, fmt.Sprintf("node-%02d", i))
	}
	all := slices.Clone(nodes)
	slices.SortFunc(all, func(a, b string) int { return cmp.Compare(hashOf(vip, b), hashOf(vip, a)) })

	shuffled := append(slices.Clone(nodes), nodes[:10]...) // with duplicates
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	for _, k := range []int{1, 5, 16, 50} {
		if got := Ranked(vip, shuffled, k); !slices.Equal(got, all[:k]) {
			t.Errorf("Ranked(k=%d) = %v, want %v", k, got, all[:k])
		}
	}
	if got := Ranked(vip, nodes[:3], 16); len(got) != 3 {
		t.Errorf("Ranked of 3 nodes, k=16: %v", got)
	}
	if got := Ranked(vip, nil, 16); len(got) != 0 {
		t.Errorf("Ranked of none: %v", got)
	}
}

// hashOf is score for one (vip, node) pair.
func hashOf(vip netip.Addr, node string) uint64 { return score(vipHash(vip), node) }
