package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/procfs"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/component-base/metrics/testutil"
	nodeutil "k8s.io/component-helpers/node/util"

	"github.com/labcloud/labcloud/provider/placement"
)

// BenchmarkSteadyState: 100 Nodes (test-driver domains on the e2e bridge,
// initialized, routed) and 100 LoadBalancer Services (VIPs announced), and
// then nothing changes; the CCM as shipped is watched for a window (60 s,
// or LABCLOUD_STEADY_WINDOW) and must make no write to the API server but
// its leader Lease renewals, no libvirt call, use under 1% of a core, and
// log at most 10 lines a minute at default verbosity.
//
//   - API writes: the API server's audit log of the CCM's identity
//     (auditPolicy), every create/update/patch/delete; Lease updates are
//     counted apart.
//   - libvirt calls: libvirt's own client-side debug log of the CCM's
//     process (LIBVIRT_LOG_FILTERS), one line per public API call; local
//     accessors that never reach a driver (Free, Ref, GetName, GetUUID...)
//     are not counted (notCalls). Keepalive pings are not API calls.
//   - CPU: utime+stime of the CCM's process over the window.
//   - Allocation: the bytes the Go heap allocated over the window (what the
//     collector's work at steady state grows with), per minute;
//     LABCLOUD_BENCH_PROFILE_DIR saves heap profiles at both ends, whose
//     difference (pprof -base) says what allocated them.
//
// Within 60 s of its start-up the CCM's periodic resync of the domain cache
// (every 5 m) does not come: a window of LABCLOUD_STEADY_WINDOW=6m holds
// one, whose two calls are allowed.
//
// The Nodes' kubelets are simulated by renewing their node Leases every
// 10 s (what a kubelet does between status reports), so no Node object
// changes during the window.
func BenchmarkSteadyState(b *testing.B) {
	requireEnv(b)
	const nodes, services = 100, 100
	window := time.Minute
	if s := os.Getenv("LABCLOUD_STEADY_WINDOW"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatalf("LABCLOUD_STEADY_WINDOW=%q: %v", s, err)
		}
		window = d
	}
	f := newFleet(b, "steady", nodes)
	libvirtLog := b.TempDir() + "/libvirt-client.log"
	// libvirt reads these when the CCM's process initializes it.
	b.Setenv("LIBVIRT_LOG_FILTERS", "1:libvirt 4:*")
	b.Setenv("LIBVIRT_LOG_OUTPUTS", "1:file:"+libvirtLog)
	ccm := startCCM(b, f.cloudConfig())
	started := time.Now()
	servicesGoneAtEnd(b, "steady-")
	waitLog(b, ccm, "Successfully acquired lease", 60*time.Second)
	f.register(b, 10*time.Second, 2*time.Minute)
	waitRoutes(b, fmt.Sprintf("%d owned routes", nodes), 2*time.Minute, func(r map[string]string) bool { return len(r) == nodes })
	createServices(b, "steady", services, 2*time.Minute)
	quietSince := waitQuiet(b, 15*time.Second, 3*time.Minute)
	b.Logf("set up; the CCM's last write other than its Lease at %s, %s after it started",
		quietSince.Format(time.TimeOnly), quietSince.Sub(started).Round(time.Second))

	pid := ccm.proc.Pid()
	cpu0 := cpuTicks(b, pid)
	log0 := fileSize(libvirtLog)
	ccmLog0 := fileSize(ccm.proc.Log)
	passes0 := placementPasses(b, ccm)
	alloc0 := ccmMetric(b, ccm, "go_memstats_alloc_bytes_total")
	if dir := os.Getenv("LABCLOUD_BENCH_PROFILE_DIR"); dir != "" {
		saveProfiles(b, ccm, dir, "steady-0")
	}
	t0 := time.Now()
	// Every Node reports its status once in the window, as a kubelet does
	// every 5 minutes when nothing changes: a heartbeat that changes
	// nothing the CCM acts on.
	reported := reportHeartbeats(b, f.prefix, nodes, window)
	t1 := time.Now()
	cpu1 := cpuTicks(b, pid)
	b.ReportMetric((ccmMetric(b, ccm, "go_memstats_alloc_bytes_total")-alloc0)/1e6/t1.Sub(t0).Minutes(), "alloc-MB/min")
	if dir := os.Getenv("LABCLOUD_BENCH_PROFILE_DIR"); dir != "" {
		saveProfiles(b, ccm, dir, "steady-1")
	}
	passes := placementPasses(b, ccm) - passes0
	if ccm.proc.Exited() {
		b.Fatalf("the CCM exited during the window:\n%s", ccm.proc.Tail(30))
	}

	writes := auditWrites(b, t0, t1)
	var apiWrites, leaseWrites int
	for _, w := range writes {
		if w.ObjectRef.Resource == "leases" {
			leaseWrites++
		} else {
			apiWrites++
		}
	}
	calls := libvirtCalls(b, libvirtLog, log0)
	// Both sources must have seen the set-up, or their zeros mean nothing.
	if before := auditWrites(b, started, t0); len(before) == 0 {
		b.Fatalf("the audit log shows no write of the CCM's while it initialized %d Nodes: the count cannot be trusted", nodes)
	}
	if before := total(libvirtCalls(b, libvirtLog, 0)) - total(calls); before == 0 {
		b.Fatalf("libvirt's log shows no call of the CCM's before the window (it lists the domains at start): the count cannot be trusted")
	}
	perMin := func(n int) float64 { return float64(n) / t1.Sub(t0).Minutes() }
	// utime and stime are in clock ticks of 1/100 s (USER_HZ on Linux).
	cpuPct := float64(cpu1-cpu0) / 100 / t1.Sub(t0).Seconds() * 100

	b.ReportMetric(perMin(apiWrites), "api-writes/min")
	b.ReportMetric(perMin(leaseWrites), "lease-writes/min")
	b.ReportMetric(perMin(total(calls)), "libvirt-calls/min")
	b.ReportMetric(cpuPct, "cpu-%")
	logLines := bytes.Count(linesSince(b, ccm.proc.Log, ccmLog0), []byte("\n"))
	b.ReportMetric(perMin(logLines), "log-lines/min")
	b.Logf("window %s, starting %s after the CCM started; lease writes %d", t1.Sub(t0).Round(time.Second), t0.Sub(started).Round(time.Second), leaseWrites)
	if apiWrites > 0 {
		b.Errorf("%d API writes besides Lease renewals in %s:\n%s", apiWrites, window, summarize(writes))
	}
	// The domain cache's periodic resync (fleetResync after the CCM
	// connects, and every fleetResync since) lists every domain's state in
	// one call and the networks in another (the fleet has none, so no
	// leases to read); a window that holds such ticks allows their calls
	// and nothing else.
	ticks := 0
	for at := started.Add(fleetResync); !at.After(t1.Add(5 * time.Second)); at = at.Add(fleetResync) {
		if !at.Before(t0.Add(-5 * time.Second)) {
			ticks++
		}
	}
	b.ReportMetric(float64(ticks), "resyncs")
	if n := total(calls); n > 2*ticks {
		b.Errorf("%d libvirt calls in %s (%d resyncs account for %d): %v", n, window, ticks, 2*ticks, calls)
	}
	if perMin(logLines) > 10 {
		b.Errorf("the CCM logged %.0f lines a minute at default verbosity, want at most 10", perMin(logLines))
	}
	// A placement pass takes every Node and every VIP route: at steady
	// state only the periodic resync runs one.
	b.ReportMetric(perMin(int(passes)), "placement-passes/min")
	if budget := int(t1.Sub(t0)/placement.Resync) + 1; int(passes) > budget {
		b.Errorf("%v placement passes in %s while %d Nodes reported heartbeats and nothing changed, want at most %d (the periodic resync)", passes, t1.Sub(t0).Round(time.Second), reported, budget)
	}
	if cpuPct >= 1 {
		b.Errorf("the CCM used %.2f%% of a core at steady state, want < 1%%", cpuPct)
	}
}

// auditEvent is the part of an audit.k8s.io/v1 Event the benchmark reads.
type auditEvent struct {
	Verb      string `json:"verb"`
	ObjectRef struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	StageTimestamp time.Time `json:"stageTimestamp"`
}

func (e auditEvent) String() string {
	r := e.ObjectRef.Resource
	if e.ObjectRef.Subresource != "" {
		r += "/" + e.ObjectRef.Subresource
	}
	return fmt.Sprintf("%s %s %s/%s", e.Verb, r, e.ObjectRef.Namespace, e.ObjectRef.Name)
}

// auditWrites returns the CCM's writes the API server completed in [from, to).
func auditWrites(tb testing.TB, from, to time.Time) []auditEvent {
	tb.Helper()
	f, err := os.Open(env.auditLog)
	if err != nil {
		tb.Fatalf("audit log: %v", err)
	}
	defer f.Close()
	var out []auditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e auditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			continue // a line being written
		}
		if !e.StageTimestamp.Before(from) && e.StageTimestamp.Before(to) {
			out = append(out, e)
		}
	}
	if err := sc.Err(); err != nil {
		tb.Fatalf("audit log: %v", err)
	}
	return out
}

// waitQuiet waits until the CCM has written nothing but its Lease for
// quiet, and returns the time of its last such write.
func waitQuiet(tb testing.TB, quiet, timeout time.Duration) time.Time {
	tb.Helper()
	var last time.Time
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, timeout, true, func(context.Context) (bool, error) {
		for _, e := range auditWrites(tb, time.Time{}, time.Now()) {
			if e.ObjectRef.Resource != "leases" && e.StageTimestamp.After(last) {
				last = e.StageTimestamp
			}
		}
		return time.Since(last) >= quiet, nil
	})
	if err != nil {
		recent := auditWrites(tb, time.Now().Add(-quiet), time.Now())
		tb.Fatalf("the CCM never stopped writing for %s within %s; the last %s:\n%s", quiet, timeout, quiet, summarize(recent))
	}
	return last
}

// summarize counts writes by verb and object.
func summarize(evs []auditEvent) string {
	counts := map[string]int{}
	for _, e := range evs {
		counts[e.String()]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "  %4d %s\n", counts[k], k)
	}
	return sb.String()
}

// libvirtAPICall matches libvirt's debug line for a public API entry point:
// "... : debug : virDomainGetXMLDesc:2669 : dom=...".
var libvirtAPICall = regexp.MustCompile(`: debug : (vir[A-Za-z0-9]+):\d+ : `)

// notCalls are logged entry points that are not the CCM's calls to a
// hypervisor: reference counting, freeing, accessors of what the client
// already holds, and virDomainGetVcpusFlags, which libvirt's test driver
// calls itself inside GetAllDomainStats (the CCM never does; with a remote
// hypervisor the driver runs in libvirtd and logs there).
var notCalls = regexp.MustCompile(`^vir\w*(Free|Ref)$|^vir(Domain|Network|Connect)(GetName|GetUUID|GetUUIDString|GetID|GetConnect)$|^virConnectOpenInternal$|^virRegister|^virGlobalInit$|^virDomainGetVcpusFlags$`)

// libvirtCalls counts the API calls logged in path after offset, by name.
func libvirtCalls(tb testing.TB, path string, offset int64) map[string]int {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatalf("libvirt client log: %v (the CCM did not pick up LIBVIRT_LOG_OUTPUTS?)", err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		tb.Fatal(err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]int{}
	for _, line := range bytes.Split(data, []byte("\n")) {
		if m := libvirtAPICall.FindSubmatch(line); m != nil && !notCalls.Match(m[1]) {
			out[string(m[1])]++
		}
	}
	return out
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// cpuTicks is the process's utime+stime (all threads) in clock ticks.
func cpuTicks(tb testing.TB, pid int) int64 {
	tb.Helper()
	p, err := procfs.NewProc(pid)
	if err != nil {
		tb.Fatal(err)
	}
	stat, err := p.Stat()
	if err != nil {
		tb.Fatal(err)
	}
	return int64(stat.UTime + stat.STime)
}

// placementPasses reads how many placement passes the CCM has run from its
// /metrics.
func placementPasses(tb testing.TB, c *ccm) float64 {
	tb.Helper()
	return ccmMetric(tb, c, "labcloud_lb_placement_pass_seconds_count")
}

// ccmMetric reads the unlabelled sample name from the CCM's /metrics.
func ccmMetric(tb testing.TB, c *ccm, name string) float64 {
	tb.Helper()
	code, body, err := get(fmt.Sprintf("https://127.0.0.1:%d/metrics", c.securePort), adminToken(tb))
	if err != nil || code != http.StatusOK {
		tb.Fatalf("/metrics: %d %v", code, err)
	}
	ms := testutil.NewMetrics()
	if err := testutil.ParseMetrics(body, &ms); err != nil {
		tb.Fatal(err)
	}
	v, ok := sampleValue(ms, name, nil)
	if !ok {
		tb.Fatalf("/metrics has no %s", name)
	}
	return v
}

// reportHeartbeats has every one of the fleet's n Nodes report Ready once,
// spread evenly over window, as kubelets renew their status: only the Ready
// condition's heartbeat time changes. It returns how many reports landed.
func reportHeartbeats(tb testing.TB, prefix string, n int, window time.Duration) int {
	tb.Helper()
	ctx := context.Background()
	end := time.Now().Add(window)
	reported := 0
	for i := range n {
		time.Sleep(time.Until(end.Add(-window + window*time.Duration(i)/time.Duration(n))))
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			node, err := env.admin.CoreV1().Nodes().Get(ctx, fleetNodeName(prefix, i), metav1.GetOptions{})
			if err != nil {
				return err
			}
			if _, ready := nodeutil.GetNodeCondition(&node.Status, v1.NodeReady); ready != nil {
				ready.LastHeartbeatTime = metav1.Now()
			}
			_, err = env.admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			tb.Errorf("heartbeat of %s: %v", fleetNodeName(prefix, i), err)
			continue
		}
		reported++
	}
	time.Sleep(time.Until(end))
	return reported
}
