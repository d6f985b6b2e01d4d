package lb

import (
	"fmt"
	"net/netip"
	"testing"
)

func benchPools(b *testing.B) *Pools {
	return mustPools(b, PoolConfig{Name: "big", Addresses: []string{"10.20.0.0/16"}, AvoidDot0Dot255: true})
}

func keys(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s/svc-%d", prefix, i)
	}
	return out
}

// BenchmarkAllocate1000 allocates 1000 Services from a /16; one op is the
// whole batch.
func BenchmarkAllocate1000(b *testing.B) {
	ps, ks := benchPools(b), keys("ns", 1000)
	req := Request{Families: []Family{IPv4}, Ports: []Port{{"TCP", 80}}}
	b.ReportAllocs()
	for b.Loop() {
		a := NewAllocator(ps)
		for _, k := range ks {
			if _, err := a.Allocate(k, req); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkAssign1000ThenAllocate loads 1000 existing assignments (every
// other address, so new ones fill the gaps), confirms them with Allocate
// as a resync would, and allocates 1000 new Services.
func BenchmarkAssign1000ThenAllocate(b *testing.B) {
	ps, old, fresh := benchPools(b), keys("old", 1000), keys("new", 1000)
	req := Request{Families: []Family{IPv4}, Ports: []Port{{"TCP", 80}}}
	ips := make([]netip.Addr, len(old))
	ip := netip.MustParseAddr("10.20.0.1")
	for i := range ips {
		ips[i] = ip
		ip = ip.Next().Next()
		if ip.As4()[3] == 255 {
			ip = ip.Next().Next()
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		a := NewAllocator(ps)
		for i, k := range old {
			if err := a.Assign(k, ips[i], req); err != nil {
				b.Fatal(err)
			}
		}
		for i, k := range old {
			if got, err := ipsOf(a.Allocate(k, req)); err != nil || got[0] != ips[i] {
				b.Fatalf("%s moved to %v: %v", k, got, err)
			}
		}
		for _, k := range fresh {
			if _, err := a.Allocate(k, req); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkPlace1000x100 places 1000 VIPs on 100 nodes.
func BenchmarkPlace1000x100(b *testing.B) {
	in := make(map[netip.Addr][]string, 1000)
	for _, vip := range vips(1000) {
		in[vip] = nodeNames(100)
	}
	b.ReportAllocs()
	for b.Loop() {
		if got := Place(in, 1); len(got) != 1000 {
			b.Fatalf("%d VIPs placed", len(got))
		}
	}
}

// BenchmarkSharedPortCheck: 20 Services share one VIP under one key with
// 5,000 ports each; one op asks whether a 21st Service with 5,000 more
// ports may join it, the check every allocation and pass makes under the
// allocator's lock.
func BenchmarkSharedPortCheck(b *testing.B) {
	a := NewAllocator(mustPools(b, PoolConfig{Name: "lan", Addresses: []string{"10.0.0.0/24"}}))
	const holders, ports = 20, 5000
	portRange := func(first int) []Port {
		out := make([]Port, ports)
		for i := range out {
			out[i] = Port{Protocol: "TCP", Port: int32(first + i)}
		}
		return out
	}
	vip := netip.MustParseAddr("10.0.0.7")
	for h := range holders {
		if err := a.Assign(fmt.Sprintf("team/s%d", h), vip, req4("", "", "k", portRange(1+h*ports)...)); err != nil {
			b.Fatal(err)
		}
	}
	next := req4("", "", "k", portRange(1+holders*ports)...)
	b.ResetTimer()
	for b.Loop() {
		a.mu.Lock()
		err := a.canHold("team/next", vip, next)
		a.mu.Unlock()
		if err != nil {
			b.Fatal(err)
		}
	}
}
