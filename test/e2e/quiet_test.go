package e2e

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"testing"
	"time"
)

// TestQuietAtSteadyState: a CCM as shipped (default verbosity) with Nodes
// and LoadBalancer Services that no longer change writes at most 10 log
// lines a minute. Upstream's route controller alone logs a line per Node
// on every 2 s pass ("action for Node … keep"), which quietlog demotes to
// -v=2: 20 Nodes would write ~600 lines a minute without it.
func TestQuietAtSteadyState(t *testing.T) {
	requireEnv(t)
	const nodes, services, window = 20, 5, 30 * time.Second
	f := newFleet(t, "quiet", nodes)
	ccm := startCCM(t, f.cloudConfig())
	servicesGoneAtEnd(t, "quiet-")
	waitLog(t, ccm, "Successfully acquired lease", 60*time.Second)
	f.register(t, 10*time.Second, 2*time.Minute)
	waitRoutes(t, fmt.Sprintf("%d owned routes", nodes), time.Minute, func(r map[string]string) bool { return len(r) == nodes })
	createServices(t, "quiet", services, time.Minute)
	waitQuiet(t, 10*time.Second, 2*time.Minute)

	lines := linesDuring(t, ccm.proc.Log, window)
	perMin := float64(bytes.Count(lines, []byte("\n"))) / window.Minutes()
	t.Logf("%.0f log lines a minute at steady state with %d Nodes and %d Services", perMin, nodes, services)
	if perMin > 10 {
		t.Errorf("the CCM logged %.0f lines a minute at steady state, want at most 10; the first in %s:\n%s", perMin, window, firstLines(lines, 20))
	}
}

// linesDuring returns what is appended to the log file at path during d.
func linesDuring(tb testing.TB, path string, d time.Duration) []byte {
	tb.Helper()
	from := fileSize(path)
	time.Sleep(d)
	return linesSince(tb, path, from)
}

// linesSince returns the log file at path from offset from on.
func linesSince(tb testing.TB, path string, from int64) []byte {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		tb.Fatal(err)
	}
	out, err := io.ReadAll(f)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

func firstLines(b []byte, n int) []byte {
	lines := bytes.SplitAfterN(b, []byte("\n"), n+1)
	return bytes.Join(lines[:min(n, len(lines))], nil)
}
