package labe2e

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/labcloud/labcloud/lab/conformance"
)

// ciConformanceSkip is what CI's conformance run leaves out of `labcloud
// e2e`'s default focus to stay within its time budget: the two rolling-update
// tests, which roll a DaemonSet over every node several times (the slowest
// tests on TCG guests). `make conformance` runs the whole focus.
const ciConformanceSkip = `rolling update`

// ciConformanceMin is how many tests of the CI subset must pass: all of the
// default focus but the two above and the [Disruptive] Node test.
const ciConformanceMin = 18

var e2eSummary = regexp.MustCompile(`(?m)^(\d+) passed, (\d+) failed, (\d+) skipped$`)

// TestConformance runs Kubernetes' own LoadBalancer e2e tests (labcloud
// e2e's default focus, less ciConformanceSkip) against a fresh three-node
// lab, as `make conformance` does, and fails on any failed test.
func TestConformance(t *testing.T) {
	l := newLabcloud(t)
	// Most of a long up is waiting for other tests to release the host.
	l.must(60*time.Minute, "up", "--nodes", "3")
	start := time.Now()
	out, err := l.run(50*time.Minute, "e2e", "--skip", conformance.DefaultSkip+"|"+ciConformanceSkip, "--junit-dir", t.TempDir())
	t.Logf("labcloud e2e (wall time %s):\n%s", time.Since(start).Round(time.Second), tail(out, 60))
	m := e2eSummary.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		t.Fatalf("labcloud e2e printed no summary (%v)", err)
	}
	last := m[len(m)-1]
	passed, _ := strconv.Atoi(last[1])
	failed, _ := strconv.Atoi(last[2])
	if failed > 0 || err != nil {
		t.Errorf("upstream e2e: %s (exit: %v)", last[0], err)
	}
	if passed < ciConformanceMin {
		t.Errorf("upstream e2e: %d passed, want at least %d", passed, ciConformanceMin)
	}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
