package lb

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

var (
	lan4    = PoolConfig{Name: "lan", Addresses: []string{"10.0.0.1-10.0.0.4"}}
	lan6    = PoolConfig{Name: "lan6", Addresses: []string{"fd00::1-fd00::2"}}
	single6 = PoolConfig{Name: "one6", Addresses: []string{"fd00::1"}}
	team6   = PoolConfig{Name: "team6", Addresses: []string{"fd00::1-fd00::2"}, Namespaces: []string{"team"}}
	dual    = []Family{IPv4, IPv6}
)

// TestFamilyPolicies: SingleStack and RequireDualStack get every family or
// nothing; PreferDualStack skips a family its pools cannot give, says why,
// and still fails when it gets nothing or when an address it named cannot
// be had.
func TestFamilyPolicies(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pools   []PoolConfig
		before  map[string]Request // allocated first, by other Services
		req     Request
		want    []string // for "ns/svc"
		skipped []Family
		skipErr error    // what each skipped family's error is
		wantErr error    // sentinel; nil for success
		says    []string // what the error or the skipped reasons say
	}{
		{
			name: "SingleStack gets its one family", pools: []PoolConfig{lan4, lan6},
			req: Request{Families: []Family{IPv4}, Policy: SingleStack}, want: []string{"10.0.0.1"},
		},
		{
			name: "no policy with two families is all or nothing", pools: []PoolConfig{lan4},
			req: Request{Families: dual}, wantErr: ErrNoPoolForFamily, says: []string{"IPv6"},
		},
		{
			name: "PreferDualStack with both pools", pools: []PoolConfig{lan4, lan6},
			req: Request{Families: dual, Policy: PreferDualStack}, want: []string{"10.0.0.1", "fd00::1"},
		},
		{
			name: "PreferDualStack in family order", pools: []PoolConfig{lan4, lan6},
			req: Request{Families: []Family{IPv6, IPv4}, Policy: PreferDualStack}, want: []string{"fd00::1", "10.0.0.1"},
		},
		{
			name: "PreferDualStack without an IPv6 pool", pools: []PoolConfig{lan4},
			req: Request{Families: dual, Policy: PreferDualStack}, want: []string{"10.0.0.1"},
			skipped: []Family{IPv6}, skipErr: ErrNoPoolForFamily, says: []string{"no pool serving namespace ns has IPv6 addresses"},
		},
		{
			name: "PreferDualStack with the IPv6 pool exhausted", pools: []PoolConfig{lan4, single6},
			before: map[string]Request{"ns/full": {Families: []Family{IPv6}}},
			req:    Request{Families: []Family{IPv6, IPv4}, Policy: PreferDualStack}, want: []string{"10.0.0.1"},
			skipped: []Family{IPv6}, skipErr: ErrPoolExhausted, says: []string{"no free IPv6 address"},
		},
		{
			name: "PreferDualStack where the IPv6 pool is another namespace's", pools: []PoolConfig{lan4, team6},
			req: Request{Families: dual, Policy: PreferDualStack}, want: []string{"10.0.0.1"},
			skipped: []Family{IPv6}, skipErr: ErrNoPoolForFamily, says: []string{"namespace ns"},
		},
		{
			name: "PreferDualStack from a requested pool of one family", pools: []PoolConfig{lan4, lan6},
			req: Request{Families: dual, Policy: PreferDualStack, Pool: "lan"}, want: []string{"10.0.0.1"},
			skipped: []Family{IPv6}, skipErr: ErrNoPoolForFamily, says: []string{`pool "lan" has no IPv6 addresses`},
		},
		{
			name: "PreferDualStack that gets nothing fails, naming both", pools: []PoolConfig{single6},
			before: map[string]Request{"ns/full": {Families: []Family{IPv6}}},
			req:    Request{Families: dual, Policy: PreferDualStack}, wantErr: ErrPoolExhausted,
			says: []string{"no pool serving namespace ns has IPv4 addresses", "no free IPv6 address"},
		},
		{
			name: "PreferDualStack with a named IPv6 address outside the pools", pools: []PoolConfig{lan4},
			req:     Request{Families: dual, Policy: PreferDualStack, IPs: addrs("fd00::9")},
			wantErr: ErrNotInPool, says: []string{"fd00::9"},
		},
		{
			name: "PreferDualStack with a named IPv6 address taken", pools: []PoolConfig{lan4, lan6},
			before:  map[string]Request{"ns/other": {Families: []Family{IPv6}}},
			req:     Request{Families: dual, Policy: PreferDualStack, IPs: addrs("fd00::1")},
			wantErr: ErrIPTaken, says: []string{"fd00::1 is taken by ns/other"},
		},
		{
			name: "RequireDualStack gets both", pools: []PoolConfig{lan4, lan6},
			req: Request{Families: dual, Policy: RequireDualStack}, want: []string{"10.0.0.1", "fd00::1"},
		},
		{
			name: "RequireDualStack with both families by default", pools: []PoolConfig{lan4, lan6},
			req: Request{Policy: RequireDualStack, IPs: addrs("fd00::2")}, want: []string{"fd00::2", "10.0.0.1"},
		},
		{
			name: "RequireDualStack listing one family", pools: []PoolConfig{lan4, lan6},
			req:     Request{Families: []Family{IPv4}, Policy: RequireDualStack},
			wantErr: ErrInvalidRequest, says: []string{"IPv6 is missing"},
		},
		{
			name: "RequireDualStack without an IPv6 pool", pools: []PoolConfig{lan4},
			req:     Request{Families: dual, Policy: RequireDualStack},
			wantErr: ErrNoPoolForFamily, says: []string{"IPv6 addresses"},
		},
		{
			name: "RequireDualStack with the IPv6 pool exhausted", pools: []PoolConfig{lan4, single6},
			before:  map[string]Request{"ns/full": {Families: []Family{IPv6}}},
			req:     Request{Families: dual, Policy: RequireDualStack},
			wantErr: ErrPoolExhausted, says: []string{"no free IPv6 address"},
		},
		{
			name: "unknown policy", pools: []PoolConfig{lan4},
			req: Request{Policy: "Sometimes"}, wantErr: ErrInvalidRequest, says: []string{"Sometimes"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAllocator(mustPools(t, tc.pools...))
			for _, k := range slices.Sorted(maps.Keys(tc.before)) {
				mustAlloc(t, a, k, tc.before[k])
			}
			held := a.VIPs()
			res, err := a.Allocate("ns/svc", tc.req)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				saysAll(t, err.Error(), tc.says)
				if got := a.Lookup("ns/svc"); got != nil || !slices.EqualFunc(a.VIPs(), held, sameVIP) {
					t.Errorf("a failed request holds %v; VIPs %v, want %v", got, a.VIPs(), held)
				}
				return
			}
			if err != nil {
				t.Fatalf("Allocate: %v", err)
			}
			if !slices.Equal(res.IPs, addrs(tc.want...)) || !slices.Equal(a.Lookup("ns/svc"), sortedAddrs(tc.want)) {
				t.Errorf("got %v (held %v), want %v", res.IPs, a.Lookup("ns/svc"), tc.want)
			}
			var fams []Family
			var why []string
			for _, s := range res.Skipped {
				fams = append(fams, s.Family)
				why = append(why, s.Err.Error())
				if !errors.Is(s.Err, tc.skipErr) {
					t.Errorf("%s skipped for %v, want %v", s.Family, s.Err, tc.skipErr)
				}
			}
			if !slices.Equal(fams, tc.skipped) {
				t.Errorf("skipped %v, want %v", fams, tc.skipped)
			}
			saysAll(t, strings.Join(why, "; "), tc.says)
		})
	}
}

func saysAll(t *testing.T, msg string, says []string) {
	t.Helper()
	for _, s := range says {
		if !strings.Contains(msg, s) {
			t.Errorf("%q does not say %q", msg, s)
		}
	}
}

func sameVIP(x, y VIP) bool { return x.IP == y.IP && slices.Equal(x.Holders, y.Holders) }

func sortedAddrs(s []string) []netip.Addr {
	if len(s) == 0 {
		return nil
	}
	return slices.SortedFunc(slices.Values(addrs(s...)), netip.Addr.Compare)
}

// TestPreferDualStackFillsInLater: a PreferDualStack Service that went
// without IPv6 gets it once an address is freed, and keeps its IPv4 VIP.
func TestPreferDualStackFillsInLater(t *testing.T) {
	a := NewAllocator(mustPools(t, lan4, single6))
	mustAlloc(t, a, "ns/full", Request{Families: []Family{IPv6}})
	req := Request{Families: dual, Policy: PreferDualStack}
	if res, err := a.Allocate("ns/svc", req); err != nil || len(res.Skipped) != 1 || !slices.Equal(res.IPs, addrs("10.0.0.1")) {
		t.Fatalf("got %+v, %v; want 10.0.0.1 with IPv6 skipped", res, err)
	}
	a.Release("ns/full")
	if res, err := a.Allocate("ns/svc", req); err != nil || len(res.Skipped) != 0 || !slices.Equal(res.IPs, addrs("10.0.0.1", "fd00::1")) {
		t.Fatalf("after IPv6 was freed: %+v, %v; want both", res, err)
	}
}

// TestSharingKeyKeepsFamiliesApart: a dual-stack Service joining a sharing
// key gets the shared address of each family, not the IPv4 one twice.
func TestSharingKeyKeepsFamiliesApart(t *testing.T) {
	a := NewAllocator(mustPools(t, lan4, lan6))
	mustAlloc(t, a, "ns/a", Request{Families: dual, SharingKey: "k", Ports: []Port{http}})
	got := mustAlloc(t, a, "ns/b", Request{Families: dual, SharingKey: "k", Ports: []Port{dns}})
	if !slices.Equal(got, addrs("10.0.0.1", "fd00::1")) {
		t.Errorf("got %v, want the shared 10.0.0.1 and fd00::1", got)
	}
}

// dualVIPs is n dual-stack Services' VIPs: ns/s<i> holds 10.0.<i>.1 and
// fd00::<i>:1.
func dualVIPs(n int) []VIP {
	var out []VIP
	for i := range n {
		k := fmt.Sprintf("ns/s%d", i)
		out = append(out,
			VIP{IP: netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), Holders: []string{k}},
			VIP{IP: netip.MustParseAddr(fmt.Sprintf("fd00::%x:1", i)), Holders: []string{k}})
	}
	return out
}

// TestRankKeys: an IPv6 VIP of a dual-stack Service ranks as its IPv4 VIP
// (the lowest, when holders differ); single-stack VIPs rank as themselves;
// the order of the input does not matter.
func TestRankKeys(t *testing.T) {
	v4a, v4b, v6a, v6b, v6c := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"),
		netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00::3")
	vips := []VIP{
		{IP: v4a, Holders: []string{"ns/only4", "ns/y"}}, // shared by an IPv4 Service and a dual-stack one
		{IP: v4b, Holders: []string{"ns/x"}},
		{IP: v6a, Holders: []string{"ns/x", "ns/y"}}, // shared by two dual-stack Services
		{IP: v6b, Holders: []string{"ns/x"}},
		{IP: v6c, Holders: []string{"ns/only6"}},
	}
	want := map[netip.Addr]netip.Addr{v6a: v4a, v6b: v4b}
	for range 20 {
		rand.Shuffle(len(vips), func(i, j int) { vips[i], vips[j] = vips[j], vips[i] })
		if got := RankKeys(vips); !maps.Equal(got, want) {
			t.Fatalf("RankKeys = %v, want %v", got, want)
		}
	}
}

// singleVIPs is n IPv4-only and n IPv6-only Services' VIPs.
func singleVIPs(n int) []VIP {
	var out []VIP
	for i := range n {
		out = append(out,
			VIP{IP: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), Holders: []string{fmt.Sprintf("ns/v4-%d", i)}},
			VIP{IP: netip.MustParseAddr(fmt.Sprintf("fd01::%x", i+1)), Holders: []string{fmt.Sprintf("ns/v6-%d", i)}})
	}
	return out
}

// TestDualStackVIPsPlacedTogether: over many dual-stack Services and node
// sets, a Service's two VIPs get the same first node, and when that node
// leaves both move to the same runner-up. Single-stack VIPs, and IPv4 VIPs
// not narrowed by their partner, rank as Ranked ranks them alone.
func TestDualStackVIPsPlacedTogether(t *testing.T) {
	const k = 4
	pairs, singles := dualVIPs(200), singleVIPs(50)
	keys := RankKeys(append(slices.Clone(pairs), singles...))
	for _, tc := range []struct {
		name    string
		narrows bool // the IPv6 VIP may use only half the nodes (a Local policy)
	}{
		{"same nodes", false},
		{"IPv6 VIP allowed on fewer nodes", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			for _, n := range []int{2, 3, 5, 8, 13} {
				nodes := nodeNames(20)
				r.Shuffle(len(nodes), func(i, j int) { nodes[i], nodes[j] = nodes[j], nodes[i] })
				nodes = nodes[:n]
				eligible := map[netip.Addr][]string{}
				for _, v := range append(slices.Clone(pairs), singles...) {
					eligible[v.IP] = nodes
				}
				for i := 1; tc.narrows && i < len(pairs); i += 2 {
					eligible[pairs[i].IP] = nodes[n/2:]
				}
				placed := PlaceTogether(eligible, keys, k)
				for _, v := range singles {
					if !slices.Equal(placed[v.IP], Ranked(v.IP, nodes, k)) {
						t.Fatalf("%d nodes: single-stack %s ranks %v, alone %v", n, v.IP, placed[v.IP], Ranked(v.IP, nodes, k))
					}
				}
				for i := 0; i < len(pairs); i += 2 {
					v4, v6 := pairs[i].IP, pairs[i+1].IP
					if !slices.Equal(placed[v4], placed[v6]) {
						t.Fatalf("%d nodes: %s ranks %v, %s ranks %v", n, v4, placed[v4], v6, placed[v6])
					}
					if !tc.narrows && !slices.Equal(placed[v4], Ranked(v4, nodes, k)) {
						t.Fatalf("%d nodes: %s ranks %v, alone %v", n, v4, placed[v4], Ranked(v4, nodes, k))
					}
					if len(placed[v4]) < 2 {
						continue
					}
					// The first node leaves: both go to the runner-up.
					first, next := placed[v4][0], placed[v4][1]
					gone := func(s string) bool { return s == first }
					without := map[netip.Addr][]string{
						v4: slices.DeleteFunc(slices.Clone(eligible[v4]), gone),
						v6: slices.DeleteFunc(slices.Clone(eligible[v6]), gone),
					}
					moved := PlaceTogether(without, keys, k)
					if moved[v4][0] != next || moved[v6][0] != next {
						t.Fatalf("%d nodes: %s left; %s went to %v, %s to %v, want %s", n, first, v4, moved[v4], v6, moved[v6], next)
					}
				}
			}
		})
	}
}

// TestPlaceTogetherEdges: an IPv6 VIP whose IPv4 partner is not placed
// still ranks as it; VIPs with no node in common each rank their own; with
// no keys PlaceTogether is Place.
func TestPlaceTogetherEdges(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")
	keys := map[netip.Addr]netip.Addr{v6: v4}
	nodes := nodeNames(6)
	if got := PlaceTogether(map[netip.Addr][]string{v6: nodes}, keys, 2); !slices.Equal(got[v6], Ranked(v4, nodes, 2)) {
		t.Errorf("IPv6 VIP alone ranks %v, want its IPv4 partner's %v", got[v6], Ranked(v4, nodes, 2))
	}
	apart := map[netip.Addr][]string{v4: nodes[:3], v6: nodes[3:]}
	got := PlaceTogether(apart, keys, 2)
	if !slices.Equal(got[v4], Ranked(v4, nodes[:3], 2)) || !slices.Equal(got[v6], Ranked(v4, nodes[3:], 2)) {
		t.Errorf("no node in common: ranked %v", got)
	}
	plain := map[netip.Addr][]string{v4: nodes, v6: nodes}
	if a, b := PlaceTogether(plain, nil, 3), Place(plain, 3); fmt.Sprint(a) != fmt.Sprint(b) || !slices.Equal(a[v6], Ranked(v6, nodes, 3)) {
		t.Errorf("without keys: %v, Place %v", a, b)
	}
}
