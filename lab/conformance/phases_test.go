package conformance

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The default focus on an IPv4 lab in three processes: the Cluster
// rolling update first, alone, then the other 19 in three; between them,
// every selected test exactly once (asked of the real e2e.test).
func TestPlanIsolatesRollingUpdates(t *testing.T) {
	bin := e2eTestBin(t)
	ctx := context.Background()
	opts := Options{Focus: DefaultFocus, Skip: DefaultSkip, Isolate: DefaultIsolate, Parallel: 3, ReportDir: "/r"}
	phases, err := plan(ctx, bin, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(phases) != 2 {
		t.Fatalf("%d runs, want 2: %+v", len(phases), phases)
	}
	first, rest := phases[0], phases[1]
	if first.Parallel != 1 || first.ReportDir != filepath.Join("/r", IsolatedDir) || rest.Parallel != 3 || rest.ReportDir != "/r" {
		t.Errorf("runs: %d processes into %s, then %d into %s; want 1 into /r/%s, then 3 into /r", first.Parallel, first.ReportDir, rest.Parallel, rest.ReportDir, IsolatedDir)
	}
	all, err := selectedTests(ctx, bin, opts)
	if err != nil {
		t.Fatal(err)
	}
	isolated, err := selectedTests(ctx, bin, first)
	if err != nil {
		t.Fatal(err)
	}
	others, err := selectedTests(ctx, bin, rest)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range isolated {
		if !strings.Contains(n, "should not have connectivity disruption during rolling update with externalTrafficPolicy=Cluster") {
			t.Errorf("isolated: %s", n)
		}
	}
	if len(isolated) != 1 || len(others) != 19 {
		t.Errorf("%d isolated and %d others, want 1 and 19", len(isolated), len(others))
	}
	both := slices.Sorted(slices.Values(append(isolated, others...)))
	slices.Sort(all)
	if !slices.Equal(both, all) {
		t.Errorf("the runs select\n%q\nthe whole selection is\n%q", both, all)
	}
}

func TestPlanOneRun(t *testing.T) {
	bin := e2eTestBin(t)
	for name, opts := range map[string]Options{
		"one process":      {Focus: DefaultFocus, Skip: DefaultSkip, Isolate: DefaultIsolate, Parallel: 1},
		"nothing isolated": {Focus: DefaultFocus, Skip: DefaultSkip, Parallel: 3},
		"none selected":    {Focus: DefaultFocus, Skip: DefaultSkip + "|rolling update", Isolate: DefaultIsolate, Parallel: 3},
		"all of them":      {Focus: "LoadBalancers.*rolling update", Skip: DefaultSkip, Isolate: "rolling update", Parallel: 3},
	} {
		t.Run(name, func(t *testing.T) {
			phases, err := plan(context.Background(), bin, opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(phases) != 1 || phases[0].Focus != opts.Focus || phases[0].Skip != opts.Skip || phases[0].Parallel != opts.Parallel {
				t.Errorf("runs %+v, want the one asked for", phases)
			}
		})
	}
}

func TestPlanRejectsBadIsolate(t *testing.T) {
	_, err := plan(context.Background(), "/nonexistent", Options{Isolate: "(", Parallel: 2})
	if err == nil || !strings.Contains(err.Error(), "--isolate") {
		t.Errorf("err %v, want one that names --isolate", err)
	}
}

// A later run's outcome replaces a skip, never the other way round.
func TestMergeResults(t *testing.T) {
	first := &Result{Wall: 10, Tests: []Test{{Name: "b", Outcome: "passed"}, {Name: "c", Outcome: "failed"}}}
	rest := &Result{Wall: 5, Tests: []Test{
		{Name: "a", Outcome: "passed"},
		{Name: "b", Outcome: "skipped", Reason: "left out by --skip"},
		{Name: "c", Outcome: "skipped", Reason: "left out by --skip"},
		{Name: "d", Outcome: "skipped", Reason: "left out by --skip"},
	}}
	got := first.merge(rest)
	var outcomes []string
	for _, tc := range got.Tests {
		outcomes = append(outcomes, tc.Name+"="+tc.Outcome)
	}
	if want := "a=passed b=passed c=failed d=skipped"; strings.Join(outcomes, " ") != want {
		t.Errorf("merged %q, want %q", strings.Join(outcomes, " "), want)
	}
	if got.Summary() != "2 passed, 1 failed, 1 skipped" || got.Wall != 15 {
		t.Errorf("%s in %v, want 2 passed, 1 failed, 1 skipped in 15", got.Summary(), got.Wall)
	}
}
