package lb

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"testing"
)

// step is one call on an Allocator, with what it must return.
type step struct {
	op      string // "alloc", "assign", "release"
	key     string
	ip      string // for assign
	req     Request
	want    []string // addresses returned by alloc; nil for none
	wantErr error    // sentinel the error must match; nil for success
	lookup  []string // if not nil, Lookup(key) afterwards (use [] for "none")
}

func testPools(t testing.TB) *Pools {
	return mustPools(t,
		PoolConfig{Name: "lan", Addresses: []string{"10.0.0.0/30"}},
		PoolConfig{Name: "big", Addresses: []string{"10.1.0.0/23"}, AvoidDot0Dot255: true},
		PoolConfig{Name: "v6", Addresses: []string{"fd00::/126"}},
		PoolConfig{Name: "tiny", Addresses: []string{"10.9.0.1-10.9.0.2"}},
	)
}

func req4(ip, pool, key string, ports ...Port) Request {
	r := Request{Families: []Family{IPv4}, Pool: pool, SharingKey: key, Ports: ports}
	if ip != "" {
		r.IPs = addrs(ip)
	}
	return r
}

var (
	http  = Port{"TCP", 80}
	https = Port{"TCP", 443}
	dns   = Port{"UDP", 53}
)

func TestAllocator(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "lowest free, stable, reused after release",
			steps: []step{
				{op: "alloc", key: "ns/a", req: req4("", "", ""), want: []string{"10.0.0.0"}},
				{op: "alloc", key: "ns/b", req: req4("", "", ""), want: []string{"10.0.0.1"}},
				{op: "alloc", key: "ns/a", req: req4("", "", ""), want: []string{"10.0.0.0"}},
				{op: "release", key: "ns/a", lookup: []string{}},
				{op: "alloc", key: "ns/c", req: req4("", "", ""), want: []string{"10.0.0.0"}},
				{op: "alloc", key: "ns/d", req: req4("", "", ""), want: []string{"10.0.0.2"}},
			},
		},
		{
			name: "pools in order, then exhausted",
			steps: []step{
				{op: "alloc", key: "ns/a", req: req4("", "tiny", ""), want: []string{"10.9.0.1"}},
				{op: "alloc", key: "ns/b", req: req4("", "tiny", ""), want: []string{"10.9.0.2"}},
				{op: "alloc", key: "ns/c", req: req4("", "tiny", ""), wantErr: ErrPoolExhausted, lookup: []string{}},
				{op: "alloc", key: "ns/1", req: req4("", "", ""), want: []string{"10.0.0.0"}},
				{op: "alloc", key: "ns/2", req: req4("", "", ""), want: []string{"10.0.0.1"}},
				{op: "alloc", key: "ns/3", req: req4("", "", ""), want: []string{"10.0.0.2"}},
				{op: "alloc", key: "ns/4", req: req4("", "", ""), want: []string{"10.0.0.3"}},
				// lan is full: the next pool skips its .0.
				{op: "alloc", key: "ns/5", req: req4("", "", ""), want: []string{"10.1.0.1"}},
			},
		},
		{
			name: "avoided addresses are skipped across a /24 boundary",
			steps: []step{
				{op: "assign", key: "ns/x", ip: "10.1.0.254", req: req4("", "", "")},
				{op: "alloc", key: "ns/a", req: req4("10.1.0.253", "", ""), want: []string{"10.1.0.253"}},
				{op: "alloc", key: "ns/b", req: req4("10.1.0.255", "big", ""), wantErr: ErrNotInPool},
				{op: "alloc", key: "ns/c", req: req4("10.1.1.0", "", ""), wantErr: ErrNotInPool},
				{op: "alloc", key: "ns/d", req: req4("10.1.1.1", "", ""), want: []string{"10.1.1.1"}},
			},
		},
		{
			name: "requested addresses",
			steps: []step{
				{op: "alloc", key: "ns/a", req: req4("10.0.0.2", "", ""), want: []string{"10.0.0.2"}},
				{op: "alloc", key: "ns/b", req: req4("10.0.0.2", "", ""), wantErr: ErrIPTaken, lookup: []string{}},
				{op: "alloc", key: "ns/c", req: req4("10.0.0.2", "", "k"), wantErr: ErrIPTaken},
				{op: "alloc", key: "ns/d", req: req4("10.5.0.1", "", ""), wantErr: ErrNotInPool},
				{op: "alloc", key: "ns/e", req: req4("10.0.0.1", "big", ""), wantErr: ErrNotInPool},
				{op: "alloc", key: "ns/f", req: req4("", "nope", ""), wantErr: ErrUnknownPool},
				{op: "alloc", key: "ns/g", req: req4("10.0.0.1", "nope", ""), wantErr: ErrUnknownPool},
				{op: "alloc", key: "ns/h", req: req4("", "", ""), want: []string{"10.0.0.0"}},
				{op: "alloc", key: "ns/i", req: req4("", "", ""), want: []string{"10.0.0.1"}},
				{op: "alloc", key: "ns/j", req: req4("", "", ""), want: []string{"10.0.0.3"}},
			},
		},
		{
			name: "sharing by key with disjoint ports",
			steps: []step{
				{op: "alloc", key: "ns/a", req: req4("10.0.0.1", "", "web", http), want: []string{"10.0.0.1"}},
				{op: "alloc", key: "ns/b", req: req4("10.0.0.1", "", "web", https), want: []string{"10.0.0.1"}},
				{op: "alloc", key: "ns/c", req: req4("10.0.0.1", "", "web", dns, http), wantErr: ErrPortConflict},
				{op: "alloc", key: "ns/d", req: req4("10.0.0.1", "", "other", dns), wantErr: ErrIPTaken},
				{op: "alloc", key: "ns/e", req: req4("10.0.0.1", "", "", dns), wantErr: ErrIPTaken},
				// No address asked: join the group's address.
				{op: "alloc", key: "ns/f", req: req4("", "", "web", dns), want: []string{"10.0.0.1"}},
				// Ports clash with the group: a fresh address.
				{op: "alloc", key: "ns/g", req: req4("", "", "web", http), want: []string{"10.0.0.0"}},
				{op: "release", key: "ns/a"},
				{op: "alloc", key: "ns/h", req: req4("10.0.0.1", "", "web", http), want: []string{"10.0.0.1"}},
			},
		},
		{
			name: "a changed request moves the address or keeps the old one",
			steps: []step{
				{op: "alloc", key: "ns/a", req: req4("", "", ""), want: []string{"10.0.0.0"}},
				{op: "alloc", key: "ns/b", req: req4("", "", ""), want: []string{"10.0.0.1"}},
				{op: "alloc", key: "ns/a", req: req4("10.0.0.3", "", ""), want: []string{"10.0.0.3"}},
				{op: "alloc", key: "ns/c", req: req4("", "", ""), want: []string{"10.0.0.0"}},
				{op: "alloc", key: "ns/a", req: req4("10.0.0.1", "", ""), wantErr: ErrIPTaken, lookup: []string{"10.0.0.3"}},
				{op: "alloc", key: "ns/a", req: req4("", "tiny", ""), want: []string{"10.9.0.1"}},
				{op: "alloc", key: "ns/d", req: req4("", "", ""), want: []string{"10.0.0.2"}},
				{op: "alloc", key: "ns/e", req: req4("", "", ""), want: []string{"10.0.0.3"}},
			},
		},
		{
			name: "changed ports leave a shared address",
			steps: []step{
				{op: "alloc", key: "ns/a", req: req4("", "", "k", http), want: []string{"10.0.0.0"}},
				{op: "alloc", key: "ns/b", req: req4("", "", "k", https), want: []string{"10.0.0.0"}},
				{op: "alloc", key: "ns/b", req: req4("", "", "k", http), want: []string{"10.0.0.1"}},
				{op: "alloc", key: "ns/a", req: req4("", "", "", http), want: []string{"10.0.0.0"}},
			},
		},
		{
			name: "dual stack is all or nothing",
			steps: []step{
				{op: "alloc", key: "ns/a", req: Request{Families: []Family{IPv6, IPv4}}, want: []string{"fd00::", "10.0.0.0"}, lookup: []string{"10.0.0.0", "fd00::"}},
				{op: "alloc", key: "ns/b", req: Request{Families: []Family{IPv4, IPv6}, IPs: addrs("fd00::3")}, want: []string{"10.0.0.1", "fd00::3"}},
				{op: "alloc", key: "ns/c", req: Request{Families: []Family{IPv6}}, want: []string{"fd00::1"}},
				{op: "alloc", key: "ns/d", req: Request{Families: []Family{IPv6}}, want: []string{"fd00::2"}},
				{op: "alloc", key: "ns/e", req: Request{Families: []Family{IPv4, IPv6}}, wantErr: ErrPoolExhausted, lookup: []string{}},
				{op: "alloc", key: "ns/f", req: req4("", "", ""), want: []string{"10.0.0.2"}},
				{op: "alloc", key: "ns/a", req: Request{Families: []Family{IPv4}}, want: []string{"10.0.0.0"}, lookup: []string{"10.0.0.0"}},
				{op: "alloc", key: "ns/g", req: Request{Families: []Family{IPv6}}, want: []string{"fd00::"}},
				{op: "alloc", key: "ns/h", req: Request{Families: []Family{IPv6}, Pool: "lan"}, wantErr: ErrNoPoolForFamily},
			},
		},
		{
			name: "hand-built requests are checked",
			steps: []step{
				{op: "alloc", key: "ns/a", req: Request{Families: []Family{IPv4, IPv4}}, wantErr: ErrInvalidRequest},
				{op: "alloc", key: "ns/a", req: Request{Families: []Family{"IPv5"}}, wantErr: ErrInvalidRequest},
				{op: "alloc", key: "ns/a", req: Request{Families: []Family{IPv4}, IPs: addrs("fd00::1")}, wantErr: ErrInvalidRequest},
				{op: "alloc", key: "ns/a", req: Request{IPs: addrs("10.0.0.1", "10.0.0.2")}, wantErr: ErrInvalidRequest},
				{op: "alloc", key: "ns/a", req: Request{IPs: addrs("fd00::2")}, want: []string{"fd00::2"}},
				{op: "alloc", key: "ns/b", req: Request{}, want: []string{"10.0.0.0"}},
			},
		},
		{
			name: "restart: load statuses, then allocate",
			steps: []step{
				{op: "assign", key: "ns/a", ip: "10.0.0.1", req: req4("", "", "")},
				{op: "assign", key: "ns/s1", ip: "10.0.0.2", req: req4("", "", "k", http)},
				{op: "assign", key: "ns/s2", ip: "10.0.0.2", req: req4("", "", "k", https)},
				{op: "assign", key: "ns/s2", ip: "10.0.0.2", req: req4("", "", "k", https)},
				{op: "assign", key: "ns/a", ip: "10.0.0.1", req: req4("", "", "")},
				{op: "assign", key: "ns/x", ip: "10.0.0.1", req: req4("", "", ""), wantErr: ErrIPTaken, lookup: []string{}},
				{op: "assign", key: "ns/y", ip: "10.0.0.2", req: req4("", "", "k", http), wantErr: ErrPortConflict},
				{op: "assign", key: "ns/a", ip: "10.0.0.3", req: req4("", "", ""), wantErr: ErrAlreadyAssigned, lookup: []string{"10.0.0.1"}},
				{op: "assign", key: "ns/z", ip: "10.7.0.1", req: req4("", "", ""), wantErr: ErrNotInPool},
				{op: "assign", key: "ns/v", ip: "10.1.0.0", req: req4("", "", ""), lookup: []string{"10.1.0.0"}},
				{op: "assign", key: "ns/a", ip: "fd00::1", req: req4("", "", ""), lookup: []string{"10.0.0.1", "fd00::1"}},
				// Nothing moves, new Services get what is left.
				{op: "alloc", key: "ns/s2", req: req4("", "", "k", https), want: []string{"10.0.0.2"}},
				{op: "alloc", key: "ns/v", req: req4("", "", ""), want: []string{"10.1.0.0"}},
				{op: "alloc", key: "ns/new", req: req4("", "", ""), want: []string{"10.0.0.0"}},
				{op: "alloc", key: "ns/new2", req: req4("", "", ""), want: []string{"10.0.0.3"}},
				{op: "alloc", key: "ns/a", req: Request{Families: []Family{IPv4, IPv6}}, want: []string{"10.0.0.1", "fd00::1"}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewAllocator(testPools(t))
			for i, s := range tt.steps {
				var got []netip.Addr
				var err error
				switch s.op {
				case "alloc":
					got, err = ipsOf(a.Allocate(s.key, s.req))
				case "assign":
					err = a.Assign(s.key, netip.MustParseAddr(s.ip), s.req)
				case "release":
					a.Release(s.key)
				default:
					t.Fatalf("step %d: unknown op %q", i, s.op)
				}
				if !errors.Is(err, s.wantErr) || (err != nil) != (s.wantErr != nil) {
					t.Fatalf("step %d %s %s: err = %v, want %v", i, s.op, s.key, err, s.wantErr)
				}
				if s.op == "alloc" && err == nil && !reflect.DeepEqual(got, addrs(s.want...)) {
					t.Fatalf("step %d %s %s: got %v, want %v", i, s.op, s.key, got, s.want)
				}
				if s.lookup != nil {
					if l := a.Lookup(s.key); !reflect.DeepEqual(l, addrs(s.lookup...)) {
						t.Fatalf("step %d: Lookup(%s) = %v, want %v", i, s.key, l, s.lookup)
					}
				}
			}
		})
	}
}

func TestAllocatorErrorDetails(t *testing.T) {
	a := NewAllocator(testPools(t))
	mustAlloc(t, a, "ns/a", req4("10.9.0.1", "", "k", http))
	mustAlloc(t, a, "ns/b", req4("10.9.0.2", "", ""))

	_, err := a.Allocate("ns/c", req4("10.9.0.2", "", ""))
	var taken *IPTakenError
	if !errors.As(err, &taken) || taken.Holder != "ns/b" || taken.IP != netip.MustParseAddr("10.9.0.2") {
		t.Errorf("taken: %v", err)
	}
	_, err = a.Allocate("ns/c", req4("10.9.0.1", "", "k", dns, http))
	var pc *PortConflictError
	if !errors.As(err, &pc) || pc.Holder != "ns/a" || pc.Port != http {
		t.Errorf("port conflict: %v", err)
	}
	_, err = a.Allocate("ns/c", req4("", "tiny", ""))
	var ex *PoolExhaustedError
	if !errors.As(err, &ex) || ex.Pool != "tiny" || ex.Family != IPv4 {
		t.Errorf("exhausted: %v", err)
	}
	_, err = a.Allocate("ns/c", req4("", "gone", ""))
	var up *UnknownPoolError
	if !errors.As(err, &up) || up.Pool != "gone" {
		t.Errorf("unknown pool: %v", err)
	}
	_, err = a.Allocate("ns/c", req4("192.0.2.1", "", ""))
	var nip *NotInPoolError
	if !errors.As(err, &nip) || nip.Pool != "" || nip.IP != netip.MustParseAddr("192.0.2.1") {
		t.Errorf("not in pool: %v", err)
	}
	// Messages name what the user must fix.
	for _, c := range []struct {
		err  error
		want string
	}{
		{&IPTakenError{IP: netip.MustParseAddr("10.0.0.1"), Holder: "ns/b"}, "10.0.0.1 is taken by ns/b"},
		{&PortConflictError{IP: netip.MustParseAddr("10.0.0.1"), Holder: "ns/a", Port: http}, "TCP/80 on shared 10.0.0.1 is already used by ns/a"},
		{&PoolExhaustedError{Pool: "tiny", Family: IPv4}, `pool "tiny" has no free IPv4 address`},
		{&PoolExhaustedError{Family: IPv6}, "no free IPv6 address in any pool"},
		{&NoPoolForFamilyError{Pool: "lan", Namespace: "ns", Family: IPv6}, `pool "lan" has no IPv6 addresses`},
		{&NoPoolForFamilyError{Namespace: "ns", Family: IPv6}, "no pool serving namespace ns has IPv6 addresses"},
		{&UnknownPoolError{Pool: "gone"}, `unknown pool "gone"`},
		{&NotInPoolError{IP: netip.MustParseAddr("10.0.0.1"), Pool: "big"}, `10.0.0.1 is not in pool "big"`},
	} {
		if c.err.Error() != c.want {
			t.Errorf("Error() = %q, want %q", c.err, c.want)
		}
	}
	if h := holdersOf(a, netip.MustParseAddr("10.9.0.1")); !reflect.DeepEqual(h, []string{"ns/a"}) {
		t.Errorf("Holders = %v", h)
	}
}

// holdersOf is the Holders of ip in a.VIPs(), nil if free.
func holdersOf(a *Allocator, ip netip.Addr) []string {
	for _, v := range a.VIPs() {
		if v.IP == ip {
			return v.Holders
		}
	}
	return nil
}

// TestSharingKeyIsPerNamespace: the same sharing key in two namespaces
// does not join their Services; within one namespace it does.
func TestSharingKeyIsPerNamespace(t *testing.T) {
	a := NewAllocator(testPools(t))
	ip := mustAlloc(t, a, "team-a/web", req4("", "lan", "shared", http))[0]
	if _, err := a.Allocate("team-b/dns", req4(ip.String(), "lan", "shared", dns)); !errors.Is(err, ErrIPTaken) {
		t.Errorf("another namespace joined %s with the same sharing key: err = %v", ip, err)
	}
	if got := mustAlloc(t, a, "team-b/other", req4("", "lan", "shared", dns)); got[0] == ip {
		t.Errorf("another namespace's key gathered on %s", ip)
	}
	if got := mustAlloc(t, a, "team-a/dns", req4("", "lan", "shared", dns)); got[0] != ip {
		t.Errorf("same namespace and key got %s, want to share %s", got[0], ip)
	}
	if err := a.Assign("team-c/x", ip, req4("", "", "shared", https)); !errors.Is(err, ErrIPTaken) {
		t.Errorf("Assign across namespaces: err = %v, want taken", err)
	}
}

// TestClaim: allocated addresses start unclaimed, loaded ones claimed, and
// a released address forgets its claim.
func TestClaim(t *testing.T) {
	a := NewAllocator(testPools(t))
	ip := mustAlloc(t, a, "ns/a", req4("", "lan", ""))[0]
	if a.Claimed(ip) {
		t.Error("a fresh allocation is claimed")
	}
	if !a.Claim(ip) || !a.Claimed(ip) || !a.VIPs()[0].Claimed {
		t.Error("Claim did not stick")
	}
	a.Release("ns/a")
	if a.Claim(ip) || a.Claimed(ip) {
		t.Error("a released address can be claimed")
	}
	mustAlloc(t, a, "ns/b", req4(ip.String(), "lan", ""))
	if a.Claimed(ip) {
		t.Error("a re-allocated address kept the old claim")
	}
	loaded := netip.MustParseAddr("10.0.0.3")
	if err := a.Assign("ns/c", loaded, req4("", "", "")); err != nil || !a.Claimed(loaded) {
		t.Errorf("an address loaded from a status is not claimed (err %v)", err)
	}
}

func TestHolders(t *testing.T) {
	a := NewAllocator(testPools(t))
	ip := netip.MustParseAddr("10.0.0.2")
	for i, p := range []Port{dns, http, https} {
		key := fmt.Sprintf("ns/%c", 'c'-i) // inserted out of order
		if err := a.Assign(key, ip, req4("", "", "k", p)); err != nil {
			t.Fatal(err)
		}
	}
	if h := holdersOf(a, ip); !reflect.DeepEqual(h, []string{"ns/a", "ns/b", "ns/c"}) {
		t.Errorf("Holders = %v, want sorted", h)
	}
	a.Release("ns/b")
	a.Release("ns/b")
	if h := holdersOf(a, ip); !reflect.DeepEqual(h, []string{"ns/a", "ns/c"}) {
		t.Errorf("after release Holders = %v", h)
	}
	a.Release("ns/a")
	a.Release("ns/c")
	if h := holdersOf(a, ip); h != nil {
		t.Errorf("Holders of a free address = %v", h)
	}
	if len(a.byShare) != 0 || len(a.byKey) != 0 || len(a.byIP) != 0 {
		t.Errorf("state left behind: %v %v %v", a.byShare, a.byKey, a.byIP)
	}
}

// TestAllocatorMatchesModel drives random allocations and releases and
// checks every automatic choice against a brute-force "lowest free".
func TestAllocatorMatchesModel(t *testing.T) {
	ps := mustPools(t,
		PoolConfig{Name: "a", Addresses: []string{"10.0.0.250-10.0.1.5", "10.0.2.0/30"}, AvoidDot0Dot255: true},
		PoolConfig{Name: "b", Addresses: []string{"10.3.0.0/30"}},
	)
	var all []netip.Addr
	for _, p := range ps.List() {
		for _, r := range p.ranges {
			for ip := r.From(); ip.Compare(r.To()) <= 0; ip = ip.Next() {
				if p.Contains(ip) {
					all = append(all, ip)
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	a := NewAllocator(ps)
	held := map[netip.Addr]string{}
	for i := range 3000 {
		key := fmt.Sprintf("ns/s%d", rng.IntN(20))
		if rng.IntN(3) == 0 {
			for _, ip := range a.Lookup(key) {
				delete(held, ip)
			}
			a.Release(key)
			continue
		}
		before := a.Lookup(key)
		want := netip.Addr{}
		if len(before) == 1 {
			want = before[0]
		} else {
			for _, ip := range all {
				if _, ok := held[ip]; !ok {
					want = ip
					break
				}
			}
		}
		got, err := ipsOf(a.Allocate(key, Request{}))
		if !want.IsValid() {
			if !errors.Is(err, ErrPoolExhausted) {
				t.Fatalf("op %d: got %v, %v; want exhausted", i, got, err)
			}
			continue
		}
		if err != nil || len(got) != 1 || got[0] != want {
			t.Fatalf("op %d: %s got %v, %v; want %s", i, key, got, err, want)
		}
		held[want] = key
	}
}

func TestAllocatorConcurrent(t *testing.T) {
	a := NewAllocator(mustPools(t, PoolConfig{Name: "p", Addresses: []string{"10.0.0.0/22"}}))
	const workers, each = 8, 100
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				key := fmt.Sprintf("ns/w%d-%d", w, i)
				ips, err := ipsOf(a.Allocate(key, Request{}))
				if err != nil {
					t.Error(err)
					return
				}
				a.Lookup(key)
				holdersOf(a, ips[0])
				if i%3 == 0 {
					a.Release(key)
				}
			}
		})
	}
	wg.Wait()
	live := map[netip.Addr]bool{}
	for w := range workers {
		for i := range each {
			for _, ip := range a.Lookup(fmt.Sprintf("ns/w%d-%d", w, i)) {
				if live[ip] {
					t.Fatalf("%s handed out twice", ip)
				}
				live[ip] = true
			}
		}
	}
	if want := workers * (each - (each+2)/3); len(live) != want {
		t.Errorf("%d live addresses, want %d", len(live), want)
	}
}

// ipsOf is the addresses of an Allocation, for tests that need no more.
func ipsOf(res Allocation, err error) ([]netip.Addr, error) { return res.IPs, err }

func mustAlloc(t testing.TB, a *Allocator, key string, req Request) []netip.Addr {
	t.Helper()
	ips, err := ipsOf(a.Allocate(key, req))
	if err != nil {
		t.Fatal(err)
	}
	return ips
}

// TestSharedPortsMatchModel: Services sharing one VIP change their ports,
// leave and come back at random; the allocator refuses exactly the
// requests a port-by-port model says conflict, and names a holder that
// really uses the port.
func TestSharedPortsMatchModel(t *testing.T) {
	a := NewAllocator(mustPools(t, PoolConfig{Name: "lan", Addresses: []string{"10.0.0.0/30"}}))
	vip := "10.0.0.1"
	rng := rand.New(rand.NewPCG(3, 4))
	model := map[string][]Port{} // key -> ports it holds at vip
	for i := range 5000 {
		key := fmt.Sprintf("ns/s%d", rng.IntN(8))
		if rng.IntN(4) == 0 {
			a.Release(key)
			delete(model, key)
			continue
		}
		var ports []Port
		for range 1 + rng.IntN(4) {
			p := Port{Protocol: []string{"TCP", "UDP"}[rng.IntN(2)], Port: int32(1 + rng.IntN(12))}
			if !slices.Contains(ports, p) {
				ports = append(ports, p)
			}
		}
		var conflict string
		for other, held := range model {
			for _, p := range ports {
				if other != key && slices.Contains(held, p) {
					conflict = other
				}
			}
		}
		_, err := a.Allocate(key, req4(vip, "", "k", ports...))
		var pc *PortConflictError
		switch {
		case conflict == "" && err != nil:
			t.Fatalf("op %d: %s %v refused: %v (model: no conflict in %v)", i, key, ports, err, model)
		case conflict != "" && !errors.As(err, &pc):
			t.Fatalf("op %d: %s %v: got %v, want a port conflict (with %s)", i, key, ports, err, conflict)
		case conflict != "" && !slices.Contains(model[pc.Holder], pc.Port):
			t.Fatalf("op %d: conflict names %s on %s, which does not use it (model %v)", i, pc.Holder, pc.Port, model)
		case conflict == "":
			model[key] = ports
		}
	}
}
