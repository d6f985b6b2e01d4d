package lb

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNewPool(t *testing.T) {
	tests := []struct {
		name    string
		cfg     PoolConfig
		in, out []string // addresses Contains must accept / reject
		wantErr []string // substrings of the error; nil means success
	}{
		{
			name: "IPv4 CIDR",
			cfg:  PoolConfig{Name: "a", Addresses: []string{"192.168.50.0/24"}},
			in:   []string{"192.168.50.0", "192.168.50.1", "192.168.50.255"},
			out:  []string{"192.168.49.255", "192.168.51.0", "fd00::1"},
		},
		{
			name: "IPv6 CIDR",
			cfg:  PoolConfig{Name: "v6", Addresses: []string{"fd00:50::/120"}},
			in:   []string{"fd00:50::", "fd00:50::ff"},
			out:  []string{"fd00:50::100", "192.168.50.1"},
		},
		{
			name: "inclusive range with spaces",
			cfg:  PoolConfig{Name: "r", Addresses: []string{"192.168.50.10 - 192.168.50.20"}},
			in:   []string{"192.168.50.10", "192.168.50.20"},
			out:  []string{"192.168.50.9", "192.168.50.21"},
		},
		{
			name: "single address and dual stack",
			cfg:  PoolConfig{Name: "d", Addresses: []string{"10.0.0.7", "fd00::7"}},
			in:   []string{"10.0.0.7", "fd00::7"},
			out:  []string{"10.0.0.8", "fd00::8"},
		},
		{
			name: "avoid .0 and .255, IPv4 only",
			cfg:  PoolConfig{Name: "b", Addresses: []string{"10.1.0.0/23", "fd00::/120"}, AvoidDot0Dot255: true},
			in:   []string{"10.1.0.1", "10.1.0.254", "10.1.1.1", "fd00::", "fd00::ff"},
			out:  []string{"10.1.0.0", "10.1.0.255", "10.1.1.0", "10.1.1.255"},
		},
		{name: "empty name", cfg: PoolConfig{Addresses: []string{"10.0.0.0/24"}}, wantErr: []string{"empty name"}},
		{name: "bad name", cfg: PoolConfig{Name: "a b", Addresses: []string{"10.0.0.0/24"}}, wantErr: []string{`pool "a b"`, "not allowed"}},
		{name: "name ends in '-'", cfg: PoolConfig{Name: "lab-", Addresses: []string{"10.0.0.0/24"}}, wantErr: []string{`pool "lab-"`, "not allowed", "starting and ending with a letter or digit"}},
		{name: "name starts with '.'", cfg: PoolConfig{Name: ".lab", Addresses: []string{"10.0.0.0/24"}}, wantErr: []string{`pool ".lab"`, "not allowed"}},
		{name: "name of 64", cfg: PoolConfig{Name: strings.Repeat("a", 64), Addresses: []string{"10.0.0.0/24"}}, wantErr: []string{"not allowed", "at most 63"}},
		{name: "name of 63 with inner '-', '_', '.'", cfg: PoolConfig{Name: "A-b_c.9" + strings.Repeat("x", 56), Addresses: []string{"10.0.0.0/24"}}, in: []string{"10.0.0.1"}},
		{name: "no addresses", cfg: PoolConfig{Name: "a"}, wantErr: []string{`pool "a"`, "no addresses"}},
		{name: "empty spec", cfg: PoolConfig{Name: "a", Addresses: []string{" "}}, wantErr: []string{`pool "a"`, `address " "`, "empty"}},
		{name: "bad CIDR", cfg: PoolConfig{Name: "a", Addresses: []string{"10.0.0.0/33"}}, wantErr: []string{`pool "a"`, `"10.0.0.0/33"`}},
		{name: "host bits", cfg: PoolConfig{Name: "a", Addresses: []string{"10.0.0.1/24"}}, wantErr: []string{`"10.0.0.1/24"`, "10.0.0.0/24"}},
		{name: "garbage", cfg: PoolConfig{Name: "a", Addresses: []string{"10.0.0.0/24", "nope"}}, wantErr: []string{`pool "a"`, `"nope"`}},
		{name: "reversed range", cfg: PoolConfig{Name: "a", Addresses: []string{"10.0.0.9-10.0.0.1"}}, wantErr: []string{`"10.0.0.9-10.0.0.1"`, "before"}},
		{name: "mixed range", cfg: PoolConfig{Name: "a", Addresses: []string{"10.0.0.1-fd00::1"}}, wantErr: []string{"mixes"}},
		{name: "half range", cfg: PoolConfig{Name: "a", Addresses: []string{"10.0.0.1-"}}, wantErr: []string{`"10.0.0.1-"`}},
		{name: "zone", cfg: PoolConfig{Name: "a", Addresses: []string{"fe80::1%eth0"}}, wantErr: []string{"zone"}},
		{name: "mapped", cfg: PoolConfig{Name: "a", Addresses: []string{"::ffff:10.0.0.1"}}, wantErr: []string{"IPv4-mapped", "10.0.0.1"}},
		{
			name:    "overlap inside a pool",
			cfg:     PoolConfig{Name: "a", Addresses: []string{"10.0.0.0/24", "10.0.0.200-10.0.1.5"}},
			wantErr: []string{`pool "a"`, "10.0.0.0/24", "10.0.0.200-10.0.1.5", "overlap"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewPool(tt.cfg)
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("NewPool succeeded, want error containing %q", tt.wantErr)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("NewPool: %v", err)
			}
			if p.Name() != tt.cfg.Name {
				t.Errorf("Name() = %q", p.Name())
			}
			for _, s := range tt.in {
				if !p.Contains(netip.MustParseAddr(s)) {
					t.Errorf("Contains(%s) = false, want true", s)
				}
			}
			for _, s := range tt.out {
				if p.Contains(netip.MustParseAddr(s)) {
					t.Errorf("Contains(%s) = true, want false", s)
				}
			}
		})
	}
}

func TestNewPools(t *testing.T) {
	tests := []struct {
		name    string
		cfgs    []PoolConfig
		wantErr []string
	}{
		{name: "none", cfgs: nil},
		{name: "disjoint", cfgs: []PoolConfig{
			{Name: "a", Addresses: []string{"10.0.0.0/24"}},
			{Name: "b", Addresses: []string{"10.0.1.0-10.0.1.9", "fd00::/64"}},
			{Name: "c", Addresses: []string{"fd01::/64"}},
		}},
		{name: "adjacent", cfgs: []PoolConfig{
			{Name: "a", Addresses: []string{"10.0.0.0-10.0.0.9"}},
			{Name: "b", Addresses: []string{"10.0.0.10-10.0.0.19"}},
		}},
		{
			name: "overlap names both",
			cfgs: []PoolConfig{
				{Name: "a", Addresses: []string{"192.168.50.0/24"}},
				{Name: "b", Addresses: []string{"192.168.50.10-192.168.50.20"}},
			},
			wantErr: []string{`pool "a" (192.168.50.0/24)`, `pool "b" (192.168.50.10-192.168.50.20)`},
		},
		{
			// b sits inside a but starts after c's start: the check must
			// remember the range that reaches furthest, not the previous one.
			name: "overlap behind a short range",
			cfgs: []PoolConfig{
				{Name: "a", Addresses: []string{"10.0.0.0/16"}},
				{Name: "c", Addresses: []string{"10.0.0.5"}},
			},
			wantErr: []string{`pool "a"`, `pool "c"`},
		},
		{
			name: "overlap IPv6",
			cfgs: []PoolConfig{
				{Name: "a", Addresses: []string{"10.0.0.0/24", "fd00::/64"}},
				{Name: "b", Addresses: []string{"fd00::ff-fd00::1:0"}},
			},
			wantErr: []string{`pool "a" (fd00::/64)`, `pool "b"`},
		},
		{
			name: "duplicate name",
			cfgs: []PoolConfig{
				{Name: "a", Addresses: []string{"10.0.0.0/24"}},
				{Name: "a", Addresses: []string{"10.0.1.0/24"}},
			},
			wantErr: []string{`pool "a"`, "twice"},
		},
		{
			name:    "bad spec names pool",
			cfgs:    []PoolConfig{{Name: "ok", Addresses: []string{"10.0.0.0/24"}}, {Name: "bad", Addresses: []string{"10.0.0.x"}}},
			wantErr: []string{`pool "bad"`, `"10.0.0.x"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps, err := NewPools(tt.cfgs)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("NewPools: %v", err)
				}
				if got := len(ps.List()); got != len(tt.cfgs) {
					t.Errorf("List() has %d pools, want %d", got, len(tt.cfgs))
				}
				return
			}
			if err == nil {
				t.Fatal("NewPools succeeded, want error")
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestOverlapIsErrPoolOverlap(t *testing.T) {
	_, err := NewPools([]PoolConfig{
		{Name: "a", Addresses: []string{"10.0.0.0/24"}},
		{Name: "b", Addresses: []string{"10.0.0.255"}},
	})
	if !errors.Is(err, ErrPoolOverlap) {
		t.Fatalf("err = %v, want ErrPoolOverlap", err)
	}
}

func TestPoolsFor(t *testing.T) {
	ps := mustPools(t,
		PoolConfig{Name: "a", Addresses: []string{"10.0.0.0/24"}, AvoidDot0Dot255: true},
		PoolConfig{Name: "b", Addresses: []string{"fd00::/120"}},
	)
	tests := []struct {
		ip, pool string // pool "" means none
	}{
		{"10.0.0.1", "a"},
		{"10.0.0.0", "a"}, // avoided for allocation, still the pool's
		{"10.0.1.1", ""},
		{"fd00::5", "b"},
		{"fd00::100", ""},
	}
	for _, tt := range tests {
		p, ok := ps.For(netip.MustParseAddr(tt.ip))
		got := ""
		if ok {
			got = p.Name()
		}
		if got != tt.pool {
			t.Errorf("For(%s) = %q, want %q", tt.ip, got, tt.pool)
		}
	}
	if _, ok := ps.Pool("nope"); ok {
		t.Error(`Pool("nope") found a pool`)
	}
	if p, _ := ps.Pool("b"); !p.Has(IPv6) || p.Has(IPv4) {
		t.Error("pool b families wrong")
	}
}

// TestPrefixRange checks the last address of a prefix spec.
func TestPrefixRange(t *testing.T) {
	for pfx, want := range map[string]string{
		"10.0.0.0/8":      "10.255.255.255",
		"10.0.0.4/30":     "10.0.0.7",
		"10.0.0.4/32":     "10.0.0.4",
		"0.0.0.0/0":       "255.255.255.255",
		"fd00:50::/120":   "fd00:50::ff",
		"fd00::/64":       "fd00::ffff:ffff:ffff:ffff",
		"2001:db8::1/128": "2001:db8::1",
	} {
		r, err := parseSpec(pfx)
		if err != nil {
			t.Fatalf("parseSpec(%s): %v", pfx, err)
		}
		if got := r.To(); got.String() != want {
			t.Errorf("parseSpec(%s).To() = %s, want %s", pfx, got, want)
		}
		if got := netip.MustParsePrefix(pfx).Addr(); r.From() != got {
			t.Errorf("parseSpec(%s).From() = %s, want %s", pfx, r.From(), got)
		}
	}
}

func mustPools(t testing.TB, cfgs ...PoolConfig) *Pools {
	t.Helper()
	ps, err := NewPools(cfgs)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// TestUnusableRangesRefused: a pool reaching into a block no VIP can come
// from is refused at start, naming the pool, the spec and the block.
func TestUnusableRangesRefused(t *testing.T) {
	for spec, block := range map[string]string{
		"0.0.0.0/8":                   "0.0.0.0/8",
		"0.0.0.1":                     "0.0.0.0/8",
		"127.0.0.10-127.0.0.20":       "127.0.0.0/8",
		"169.254.1.0/24":              "169.254.0.0/16",
		"224.0.0.0/24":                "224.0.0.0/4",
		"239.255.255.250":             "224.0.0.0/4",
		"255.255.255.255":             "255.255.255.255/32",
		"192.168.1.0-255.255.255.255": "224.0.0.0/4",
		"::/127":                      "::/128",
		"fe80::1-fe80::9":             "fe80::/10",
		"ff02::1":                     "ff00::/8",
	} {
		_, err := NewPool(PoolConfig{Name: "p", Addresses: []string{spec}})
		if err == nil || !strings.Contains(err.Error(), `pool "p": address "`+spec+`"`) || !strings.Contains(err.Error(), block) {
			t.Errorf("pool of %s: %v, want it refused naming %s", spec, err, block)
		}
	}
	for _, spec := range []string{"10.0.0.0/8", "192.168.50.240/28", "fd00::/64", "2001:db8::/120", "1.0.0.0-126.255.255.255"} {
		if _, err := NewPool(PoolConfig{Name: "p", Addresses: []string{spec}}); err != nil {
			t.Errorf("pool of %s refused: %v", spec, err)
		}
	}
	for _, ip := range []string{"169.254.1.1", "224.0.0.5", "0.0.0.0", "::1", "fe80::1"} {
		_, err := ParseRequest(&v1.Service{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationIP: ip}}})
		if err == nil {
			t.Errorf("a request for %s is accepted", ip)
		}
	}
}

// TestExcludedAddressesAreNeverHandedOut: a pool of the top of a /24
// (x.240/28) would hand out the subnet's broadcast .255; excluded, it
// does not, its size says so, and an address a Service held already
// stays held.
func TestExcludedAddressesAreNeverHandedOut(t *testing.T) {
	ps := mustPools(t, PoolConfig{Name: "top", Addresses: []string{"192.168.50.252/30"}})
	edges := addrs("192.168.50.0", "192.168.50.255")
	ex := ps.Excluding(edges)
	p, _ := ex.Pool("top")
	if p.Contains(netip.MustParseAddr("192.168.50.255")) || !p.Contains(netip.MustParseAddr("192.168.50.254")) || p.Size() != 3 {
		t.Errorf("excluded pool: contains .255 %v, .254 %v, size %v; want false, true, 3",
			p.Contains(netip.MustParseAddr("192.168.50.255")), p.Contains(netip.MustParseAddr("192.168.50.254")), p.Size())
	}
	if orig, _ := ps.Pool("top"); !orig.Contains(netip.MustParseAddr("192.168.50.255")) {
		t.Error("Excluding changed the pools it was called on")
	}
	a := NewAllocator(ex)
	if err := a.Assign("ns/old", netip.MustParseAddr("192.168.50.255"), Request{}); err != nil {
		t.Errorf("an address held before it was excluded is refused: %v", err)
	}
	var got []netip.Addr
	for i := range 4 {
		ips, err := ipsOf(a.Allocate(fmt.Sprintf("ns/s%d", i), Request{}))
		if err != nil {
			break
		}
		got = append(got, ips...)
	}
	if want := addrs("192.168.50.252", "192.168.50.253", "192.168.50.254"); !slices.Equal(got, want) {
		t.Errorf("handed out %v, want %v and then exhausted", got, want)
	}
}
