package e2e

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// BenchmarkCCMMemory: the CCM as shipped (every controller, routes and
// load balancers on the e2e bridge) with 1000 Nodes and then 1000
// LoadBalancer Services, all initialized, routed where
// kube-controller-manager could give a pod CIDR (its /16 holds 256 /24s)
// and announced. It reports the CCM's resident memory split as the kernel
// counts it: anonymous (what the process allocated: Go heap and stacks,
// libvirt's C allocations — here including libvirt's in-process test driver
// holding the 1000 domains, which in production live in libvirtd) and
// file-backed (pages of the binary and its libraries), at idle (connected,
// informers synced, no Node) and their peaks over the whole run, with the
// kernel's peak of the sum (VmHWM). LABCLOUD_BENCH_PROFILE_DIR saves the
// CCM's memory map and heap profile at the end.
func BenchmarkCCMMemory(b *testing.B) {
	requireEnv(b)
	const nodes, services = 1000, 1000
	f := newFleet(b, "mem", nodes)
	ccm := startCCMWithEnv(b, os.Getenv("LABCLOUD_BENCH_CCM_ENV"), f.cloudConfig())
	servicesGoneAtEnd(b, "mem-")
	mem := sampleMem(b, ccm.proc.Pid())
	waitLog(b, ccm, "Successfully acquired lease", 60*time.Second)
	time.Sleep(3 * time.Second) // informers synced, hypervisor listed
	idle, err := readProcMem(ccm.proc.Pid())
	if err != nil {
		b.Fatal(err)
	}
	cpu0 := cpuTicks(b, ccm.proc.Pid())

	start := time.Now()
	f.register(b, 20*time.Second, 3*time.Minute)
	b.Logf("%d Nodes initialized in %s", nodes, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	createServices(b, "mem", services, 3*time.Minute)
	b.Logf("%d Services announced in %s", services, time.Since(start).Round(time.Millisecond))
	time.Sleep(5 * time.Second) // events flushed, placement settled
	end, err := readProcMem(ccm.proc.Pid())
	if err != nil {
		b.Fatal(err)
	}
	// What the work cost the CCM (the GC's share included), in CPU seconds.
	b.ReportMetric(float64(cpuTicks(b, ccm.proc.Pid())-cpu0)/100, "cpu-s")
	if dir := os.Getenv("LABCLOUD_BENCH_PROFILE_DIR"); dir != "" {
		saveProfiles(b, ccm, dir, "mem-end")
	}
	peak := mem.peaks()
	b.ReportMetric(mib(idle.anon), "idle-anon-MiB")
	b.ReportMetric(mib(idle.file), "idle-file-MiB")
	b.ReportMetric(mib(peak.anon), "peak-anon-MiB")
	b.ReportMetric(mib(peak.file), "peak-file-MiB")
	b.ReportMetric(mib(max(peak.hwm, end.hwm)), "peak-rss-MiB")
	b.ReportMetric(mib(end.anon), "end-anon-MiB")
	b.ReportMetric(mib(end.file), "end-file-MiB")
}

// startCCMWithEnv starts the CCM with extra environment variables, given
// as "K=V,K=V" (LABCLOUD_BENCH_CCM_ENV, e.g. GOGC=50 or GOMEMLIMIT=64MiB to
// measure the Go runtime's knobs), set for that process only.
func startCCMWithEnv(b *testing.B, extra, cloudConfig string) *ccm {
	for _, kv := range strings.Split(extra, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			continue
		}
		old, had := os.LookupEnv(k)
		if err := os.Setenv(k, v); err != nil {
			b.Fatal(err)
		}
		defer func() {
			if had {
				os.Setenv(k, old)
			} else {
				os.Unsetenv(k)
			}
		}()
		b.Logf("the CCM runs with %s=%s", k, v)
	}
	return startCCM(b, cloudConfig)
}

// saveProfiles writes the CCM's memory map (/proc/PID/smaps) and its Go
// heap profile with runtime.MemStats (/debug/pprof/heap, read as a cluster
// admin through the secure port) into dir, for LABCLOUD_BENCH_PROFILE_DIR.
func saveProfiles(tb testing.TB, c *ccm, dir, name string) {
	tb.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	smaps, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", c.proc.Pid()))
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".smaps"), smaps, 0o644); err != nil {
		tb.Fatal(err)
	}
	admin, err := clientcmd.BuildConfigFromFlags("", env.cp.AdminKube)
	if err != nil {
		tb.Fatal(err)
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the CCM's self-signed certificate
	for file, path := range map[string]string{name + ".heap.pb.gz": "/debug/pprof/heap", name + ".heap.txt": "/debug/pprof/heap?debug=1"} {
		req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d%s", c.securePort, path), nil)
		if err != nil {
			tb.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+admin.BearerToken)
		resp, err := client.Do(req)
		if err != nil {
			tb.Errorf("%s: %v", path, err)
			continue
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			tb.Errorf("%s: %d %v", path, resp.StatusCode, err)
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, file), data, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Logf("profiles of the CCM in %s", dir)
}
