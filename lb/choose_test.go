package lb

import (
	"fmt"
	"maps"
	"slices"
	"testing"
)

func TestChooseAnnouncer(t *testing.T) {
	// Which of n1/n2 the hash prefers for this VIP, so the table can say
	// "the other one" without hard-coding hash values.
	vip := "192.168.50.10"
	first, second := "n1", "n2"
	if tieHash(vip, "n2") < tieHash(vip, "n1") {
		first, second = second, first
	}
	tests := []struct {
		name     string
		current  string
		eligible []string
		load     map[string]int
		want     string
	}{
		{name: "none eligible", eligible: nil, want: ""},
		{name: "none eligible, current lost", current: "n1", eligible: nil, want: ""},
		{name: "only one", eligible: []string{"n3"}, want: "n3"},
		{name: "keep current", current: "n2", eligible: []string{"n1", "n2", "n3"}, load: map[string]int{"n2": 9}, want: "n2"},
		{name: "current gone: least loaded", current: "n9", eligible: []string{"n1", "n2", "n3"}, load: map[string]int{"n1": 2, "n2": 1, "n3": 2}, want: "n2"},
		{name: "missing load is zero", eligible: []string{"n1", "n2", "n3"}, load: map[string]int{"n1": 1, "n3": 1}, want: "n2"},
		{name: "tie broken by hash", eligible: []string{"n1", "n2"}, want: first},
		{name: "tie broken by hash, order does not matter", eligible: []string{"n2", "n1"}, want: first},
		{name: "load beats hash", eligible: []string{"n1", "n2"}, load: map[string]int{first: 1}, want: second},
		{name: "duplicates harmless", eligible: []string{"n1", "n1"}, want: "n1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ChooseAnnouncer(vip, tt.current, tt.eligible, tt.load); got != tt.want {
				t.Errorf("ChooseAnnouncer = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestChooseAnnouncerSpread places 30 VIPs on 3 nodes one by one, as a
// controller would, and expects an even split; then a node fails and its
// VIPs move to the other two, evenly, while the rest stay put.
func TestChooseAnnouncerSpread(t *testing.T) {
	nodes := []string{"node-a", "node-b", "node-c"}
	load := map[string]int{}
	owner := map[string]string{}
	for i := range 30 {
		vip := fmt.Sprintf("192.168.50.%d", 10+i)
		n := ChooseAnnouncer(vip, "", nodes, load)
		owner[vip] = n
		load[n]++
	}
	for _, n := range nodes {
		if load[n] != 10 {
			t.Fatalf("load %v, want 10 each", load)
		}
	}

	alive := []string{"node-a", "node-c"}
	after := map[string]int{"node-a": 10, "node-c": 10}
	for i := range 30 {
		vip := fmt.Sprintf("192.168.50.%d", 10+i)
		n := ChooseAnnouncer(vip, owner[vip], alive, after)
		if owner[vip] != "node-b" {
			if n != owner[vip] {
				t.Errorf("%s moved from %s to %s", vip, owner[vip], n)
			}
			continue
		}
		after[n]++
	}
	if after["node-a"] != 15 || after["node-c"] != 15 {
		t.Errorf("after failure load %v, want 15/15", after)
	}
}

// TestTieHashSpreads checks that with no load to go by, the hash alone
// still sends VIPs to every node.
func TestTieHashSpreads(t *testing.T) {
	nodes := []string{"node-a", "node-b", "node-c"}
	count := map[string]int{}
	for i := range 30 {
		count[ChooseAnnouncer(fmt.Sprintf("192.168.50.%d", 10+i), "", nodes, nil)]++
	}
	for _, n := range nodes {
		if count[n] < 3 {
			t.Errorf("only %d of 30 VIPs on %s with equal loads: %v", count[n], n, count)
		}
	}
}

func TestChooseAnnouncers(t *testing.T) {
	three := []string{"n1", "n2", "n3"}
	tests := []struct {
		name string
		in   map[string]AnnouncerInput
		want func(t *testing.T, got map[string]string)
	}{
		{
			name: "empty",
			in:   nil,
			want: func(t *testing.T, got map[string]string) {
				if len(got) != 0 {
					t.Errorf("got %v", got)
				}
			},
		},
		{
			name: "kept ones count before new ones are placed",
			in: map[string]AnnouncerInput{
				"v1": {Current: "n1", Eligible: three},
				"v2": {Current: "n1", Eligible: three},
				"v3": {Eligible: three},
				"v4": {Eligible: three},
				"v5": {Current: "gone", Eligible: three},
			},
			want: func(t *testing.T, got map[string]string) {
				if got["v1"] != "n1" || got["v2"] != "n1" {
					t.Errorf("current not kept: %v", got)
				}
				load := map[string]int{}
				for _, n := range got {
					load[n]++
				}
				if len(got) != 5 || load["n1"] != 2 || load["n2"] < 1 || load["n3"] < 1 {
					t.Errorf("unbalanced: %v", got)
				}
			},
		},
		{
			name: "no eligible node leaves the VIP out",
			in: map[string]AnnouncerInput{
				"v1": {Current: "n1"},
				"v2": {Eligible: []string{"n2"}},
			},
			want: func(t *testing.T, got map[string]string) {
				if !maps.Equal(got, map[string]string{"v2": "n2"}) {
					t.Errorf("got %v", got)
				}
			},
		},
		{
			name: "Local policy: only nodes with endpoints",
			in: map[string]AnnouncerInput{
				"v1": {Eligible: []string{"n3"}},
				"v2": {Eligible: []string{"n3"}},
				"v3": {Eligible: []string{"n1", "n3"}},
			},
			want: func(t *testing.T, got map[string]string) {
				if !maps.Equal(got, map[string]string{"v1": "n3", "v2": "n3", "v3": "n1"}) {
					t.Errorf("got %v", got)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ChooseAnnouncers(tt.in)
			tt.want(t, got)
			if again := ChooseAnnouncers(tt.in); !maps.Equal(got, again) {
				t.Errorf("not deterministic: %v then %v", got, again)
			}
		})
	}
}

func TestChooseAnnouncersSpread(t *testing.T) {
	nodes := make([]string, 100)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("node-%03d", i)
	}
	in := map[string]AnnouncerInput{}
	for i := range 1000 {
		in[fmt.Sprintf("10.1.%d.%d", i/250, i%250+1)] = AnnouncerInput{Eligible: nodes}
	}
	load := map[string]int{}
	for _, n := range ChooseAnnouncers(in) {
		load[n]++
	}
	if got := slices.Sorted(maps.Values(load)); got[0] != 10 || got[len(got)-1] != 10 || len(got) != 100 {
		t.Errorf("loads from %d to %d over %d nodes, want 10 on each of 100", got[0], got[len(got)-1], len(got))
	}
}
