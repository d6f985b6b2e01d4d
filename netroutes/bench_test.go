package netroutes

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const benchRoutes = 1000

// benchLab returns 1000 /24 pod routes via distinct gateways on a /16 bridge.
func benchLab() (subnet string, routes []Route) {
	for i := range benchRoutes {
		dst := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + i/256), byte(i % 256), 0}), 24)
		gw := netip.AddrFrom4([4]byte{10, 88, byte(i / 200), byte(10 + i%200)})
		routes = append(routes, Route{Dst: dst, Gateway: gw})
	}
	return "10.88.0.1/16", routes
}

// BenchmarkReconcile1000 times converging 1000 routes from empty in a fresh
// namespace (ns/op and ms/converge), and for comparison `ip -batch` adding
// the same routes in another fresh namespace (ms/ip-batch). writes/2nd-pass
// is what a second Reconcile costs; it must be 0.
func BenchmarkReconcile1000(b *testing.B) {
	subnet, routes := benchLab()
	batch := filepath.Join(b.TempDir(), "routes.batch")
	var lines strings.Builder
	for _, r := range routes {
		fmt.Fprintf(&lines, "route add %s via %s dev %s proto %d metric %d\n", r.Dst, r.Gateway, labBridge, DefaultProtocol, DefaultMetric)
	}
	if err := os.WriteFile(batch, []byte(lines.String()), 0o644); err != nil {
		b.Fatal(err)
	}

	var converge, ipBatch time.Duration
	var secondPass uint64
	b.StopTimer()
	for range b.N {
		n := newTestNS(b)
		n.addBridge(b, 1, subnet)
		m, err := New(n.handle(b), Config{Bridge: labBridge})
		if err != nil {
			b.Fatal(err)
		}

		b.StartTimer()
		start := time.Now()
		res, err := m.Reconcile(routes)
		converge += time.Since(start)
		b.StopTimer()
		if err != nil || len(res.Added) != benchRoutes {
			b.Fatalf("Reconcile added %d routes: %v", len(res.Added), err)
		}
		before := m.Writes()
		if _, err := m.Reconcile(routes); err != nil {
			b.Fatal(err)
		}
		secondPass += m.Writes() - before
		n.Close(b)

		n = newTestNS(b)
		n.addBridge(b, 1, subnet)
		start = time.Now()
		out, err := exec.Command("ip", "-n", n.name, "-batch", batch).CombinedOutput()
		ipBatch += time.Since(start)
		if err != nil {
			b.Fatalf("ip -batch: %v: %s", err, out)
		}
		if got := strings.Count(n.show(b, "proto", "76"), "\n"); got != benchRoutes {
			b.Fatalf("ip -batch installed %d routes, want %d", got, benchRoutes)
		}
		n.Close(b)
	}

	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(b.N) }
	b.ReportMetric(ms(converge), "ms/converge")
	b.ReportMetric(ms(ipBatch), "ms/ip-batch")
	b.ReportMetric(float64(converge)/float64(ipBatch), "x-ip-batch")
	b.ReportMetric(float64(secondPass)/float64(b.N), "writes/2nd-pass")
}

// BenchmarkConvergedPasses is what placement and the route controller pay
// at steady state with 1000 VIPs spread over 16 next hops each beside 256
// pod-CIDR routes, in one namespace: a VIP ReconcilePaths that finds every
// route in place (vip-pass) and the pod-CIDR Manager's List, which the
// route controller runs every 2 s (pod-list). Read B/op and allocs/op.
func BenchmarkConvergedPasses(b *testing.B) {
	n := newTestNS(b)
	n.addBridge(b, 1, "10.88.0.1/16")
	pods, err := New(n.handle(b), Config{Bridge: labBridge})
	if err != nil {
		b.Fatal(err)
	}
	vips, err := New(n.handle(b), Config{Bridge: labBridge, Protocol: VIPProtocol})
	if err != nil {
		b.Fatal(err)
	}
	var podRoutes []Route
	for i := range 256 {
		podRoutes = append(podRoutes, Route{
			Dst:     netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24),
			Gateway: netip.AddrFrom4([4]byte{10, 88, 1, byte(1 + i)}),
		})
	}
	if _, err := pods.Reconcile(podRoutes); err != nil {
		b.Fatal(err)
	}
	var paths []Paths
	for i := range benchRoutes {
		p := Paths{Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 89, byte(i / 256), byte(i % 256)}), 32)}
		for j := range 16 {
			p.Gateways = append(p.Gateways, netip.AddrFrom4([4]byte{10, 88, 2 + byte(j), byte(1 + (i+j)%250)}))
		}
		paths = append(paths, p)
	}
	if w, err := vips.ReconcilePaths(paths); err != nil || w != benchRoutes {
		b.Fatalf("first ReconcilePaths: %d writes, %v", w, err)
	}
	b.Run("vip-pass", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if w, err := vips.ReconcilePaths(paths); err != nil || w != 0 {
				b.Fatalf("converged ReconcilePaths: %d writes, %v", w, err)
			}
		}
	})
	b.Run("pod-list", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if got, err := pods.List(); err != nil || len(got) != len(podRoutes) {
				b.Fatalf("List: %d routes, %v", len(got), err)
			}
		}
	})
}
