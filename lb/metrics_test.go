package lb

import (
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"

	"k8s.io/component-base/metrics/testutil"

	"github.com/labcloud/labcloud/metrics"
)

func TestPoolSize(t *testing.T) {
	for _, tc := range []struct {
		addrs []string
		avoid bool
		want  float64
	}{
		{[]string{"10.0.0.0/30"}, false, 4},
		{[]string{"10.0.0.0/24"}, false, 256},
		{[]string{"10.0.0.0/24"}, true, 254},
		{[]string{"10.0.0.0/23"}, true, 508},
		{[]string{"10.0.0.250-10.0.1.5"}, true, 10},
		{[]string{"10.0.0.255"}, true, 0},
		{[]string{"10.0.0.255"}, false, 1},
		{[]string{"10.0.0.1-10.0.0.2", "10.0.1.0/31"}, true, 3},
		{[]string{"10.0.0.0/8"}, false, 1 << 24},
		{[]string{"fd00::/126"}, true, 4}, // avoiding is IPv4 only
		{[]string{"fd00::/64"}, false, 1 << 64},
		{[]string{"fd00::ffff:ffff:ffff:fffe-fd00::1:0:0:0:1"}, false, 4}, // borrows across the 64-bit halves
		{[]string{"2000::/3"}, false, math.Pow(2, 125)},
	} {
		p, err := NewPool(PoolConfig{Name: "p", Addresses: tc.addrs, AvoidDot0Dot255: tc.avoid})
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Size(); got != tc.want {
			t.Errorf("Size(%v, avoid=%v) = %v, want %v", tc.addrs, tc.avoid, got, tc.want)
		}
	}
}

// TestPoolSizeMatchesCount checks Size against counting the allocatable
// addresses one by one, over random IPv4 ranges.
func TestPoolSizeMatchesCount(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		first := netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(256)), byte(r.IntN(256))})
		last := first
		for range r.IntN(1200) {
			last = last.Next()
		}
		p, err := NewPool(PoolConfig{Name: "p", Addresses: []string{first.String() + "-" + last.String()}, AvoidDot0Dot255: r.IntN(2) == 0})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for ip := first; ; ip = ip.Next() {
			if p.Contains(ip) {
				n++
			}
			if ip == last {
				break
			}
		}
		if p.Size() != float64(n) {
			t.Fatalf("%s-%s avoid=%v: Size %v, counted %d", first, last, p.avoid, p.Size(), n)
		}
	}
}

// TestAllocatorMetrics: pool size and use, allocations (free -> held) and
// releases (held -> free) follow what the allocator does; loading from a
// status and joining a shared address are not allocations.
func TestAllocatorMetrics(t *testing.T) {
	metrics.Register()
	const pool = "metrics-test"
	a := NewAllocator(mustPools(t, PoolConfig{Name: pool, Addresses: []string{"10.5.0.1-10.5.0.3"}}))
	value := func(what string) float64 {
		t.Helper()
		var (
			v   float64
			err error
		)
		switch what {
		case "size":
			v, err = testutil.GetGaugeMetricValue(metrics.PoolAddresses.WithLabelValues(pool))
		case "in use":
			v, err = testutil.GetGaugeMetricValue(metrics.PoolAddressesInUse.WithLabelValues(pool))
		case "allocations":
			v, err = testutil.GetCounterMetricValue(metrics.Allocations.WithLabelValues(pool))
		case "releases":
			v, err = testutil.GetCounterMetricValue(metrics.Releases.WithLabelValues(pool))
		}
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	allocs0, releases0 := value("allocations"), value("releases")
	check := func(step string, inUse, allocs, releases float64) {
		t.Helper()
		if got := value("in use"); got != inUse {
			t.Errorf("%s: in use %v, want %v", step, got, inUse)
		}
		if got := value("allocations") - allocs0; got != allocs {
			t.Errorf("%s: %v allocations, want %v", step, got, allocs)
		}
		if got := value("releases") - releases0; got != releases {
			t.Errorf("%s: %v releases, want %v", step, got, releases)
		}
	}
	if got := value("size"); got != 3 {
		t.Errorf("pool size %v, want 3", got)
	}
	check("new", 0, 0, 0)

	if err := a.Assign("ns/loaded", netip.MustParseAddr("10.5.0.3"), req4("", "", "")); err != nil {
		t.Fatal(err)
	}
	check("loaded from a status", 1, 0, 0)
	mustAlloc(t, a, "ns/a", req4("", "", "k", http))
	check("allocated", 2, 1, 0)
	mustAlloc(t, a, "ns/a", req4("", "", "k", http))
	check("allocated again", 2, 1, 0)
	mustAlloc(t, a, "ns/b", req4("", "", "k", https))
	check("joined a shared address", 2, 1, 0)
	a.Release("ns/a")
	check("one sharer left", 2, 1, 0)
	a.Release("ns/b")
	check("last sharer left", 1, 1, 1)
	mustAlloc(t, a, "ns/c", req4("10.5.0.2", "", ""))
	check("requested", 2, 2, 1)
	mustAlloc(t, a, "ns/c", req4("10.5.0.1", "", ""))
	check("moved to another address", 2, 3, 2)
	if _, err := a.Allocate("ns/d", req4("10.5.0.1", "", "")); err == nil {
		t.Fatal("a taken address was allocated twice")
	}
	check("refused", 2, 3, 2)
}
