package labe2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/labcloud/labcloud/lab/chaos"
)

// TestChaosSoak brings a two-node lab up and runs `labcloud chaos` on it
// with a fixed seed: no invariant may break beyond its settle time, and
// faults of several kinds must really have been injected. The duration
// and seed default to a short soak; CI's longer soak sets them
// (LABCLOUD_CHAOS_DURATION=5m, LABCLOUD_CHAOS_SEED; make chaos-soak).
func TestChaosSoak(t *testing.T) {
	duration, seed := 75*time.Second, int64(11)
	if v := os.Getenv("LABCLOUD_CHAOS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("LABCLOUD_CHAOS_DURATION=%q: %v", v, err)
		}
		duration = d
	}
	if v := os.Getenv("LABCLOUD_CHAOS_SEED"); v != "" {
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("LABCLOUD_CHAOS_SEED=%q: %v", v, err)
		}
		seed = s
	}
	l := newLabcloud(t)
	l.must(30*time.Minute, "up", "--nodes", "2")

	summaryFile := filepath.Join(t.TempDir(), "chaos.json")
	// Room for the last fault's hold and settle, and for waits on booting nodes.
	out, err := l.run(duration+10*time.Minute, "chaos", "--duration", duration.String(), "--seed", strconv.FormatInt(seed, 10), "--json", summaryFile, "--verbose")
	t.Logf("labcloud chaos --duration %s --seed %d:\n%s", duration, seed, out)
	data, rerr := os.ReadFile(summaryFile)
	if rerr != nil {
		t.Fatalf("no chaos summary (%v); chaos: %v", rerr, err)
	}
	var sum chaos.Summary
	if err := json.Unmarshal(data, &sum); err != nil {
		t.Fatalf("chaos summary: %v\n%s", err, data)
	}
	for _, v := range sum.Violations {
		t.Errorf("violation: %s", v)
	}
	if err != nil && len(sum.Violations) == 0 {
		t.Errorf("chaos failed without a violation: %v", err)
	}
	if err == nil && len(sum.Violations) > 0 {
		t.Error("chaos exited 0 despite violations")
	}
	total := 0
	for _, n := range sum.Faults {
		total += n
	}
	// The first two faults create Services; the rest are drawn at random.
	if total < 5 || len(sum.Faults) < 3 {
		t.Errorf("only %d faults of %d kinds injected in %s: %v", total, len(sum.Faults), duration, sum.Faults)
	}
	if sum.Checks < int(duration/(5*time.Second)) {
		t.Errorf("only %d invariant checks in %s", sum.Checks, duration)
	}
	if sum.Skipped > sum.Checks/4 { // the API server is away while the bridge is re-created
		t.Errorf("%d of %d checks skipped (incomplete snapshots)", sum.Skipped, sum.Checks)
	}
}
