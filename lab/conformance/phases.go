package conformance

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// DefaultIsolate selects the test that runs first, alone: the rolling
// update with externalTrafficPolicy Cluster counts the requests dropped
// while pods restart, and there kube-proxy sends connections to any ready
// pod, however new, which the CCM cannot steer. On a busy TCG node a new
// pod counts as ready 6-9 s before agnhost listens; beside other tests the
// update answered 92.17-98.94 % of its requests (threshold 95 %). The
// Local one passes beside the rest: the CCM holds a node with a new pod
// back from the VIP.
const DefaultIsolate = `should not have connectivity disruption during rolling update with externalTrafficPolicy=Cluster`

// IsolatedDir is the subdirectory of the report directory that receives
// the isolated tests' JUnit report.
const IsolatedDir = "isolated"

// plan splits a run into the runs of Ginkgo's runner it takes: first the
// selected tests that match opts.Isolate, in as many processes as there are
// of them (up to opts.Parallel), then the rest in opts.Parallel processes.
// It is one run when nothing selected matches, when everything does, or
// when the tests run one at a time anyway. It asks e2e.test itself (a
// Ginkgo dry run, no cluster) which tests opts.Focus and opts.Skip select.
func plan(ctx context.Context, bin string, opts Options) ([]Options, error) {
	if opts.Isolate == "" || opts.Parallel <= 1 {
		return []Options{opts}, nil
	}
	isolate, err := regexp.Compile(opts.Isolate)
	if err != nil {
		return nil, fmt.Errorf("--isolate: %w", err)
	}
	selected, err := selectedTests(ctx, bin, opts)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, t := range selected {
		if isolate.MatchString(t) {
			// Ginkgo matches a test's whole text after the suite's name.
			names = append(names, regexp.QuoteMeta(t)+"$")
		}
	}
	if len(names) == 0 || len(names) == len(selected) {
		return []Options{opts}, nil
	}
	exact := strings.Join(names, "|")
	first := opts
	first.Focus, first.Skip = exact, ""
	first.Parallel = min(len(names), opts.Parallel)
	first.ReportDir = filepath.Join(opts.ReportDir, IsolatedDir)
	rest := opts
	rest.Skip = exact
	if opts.Skip != "" {
		rest.Skip = opts.Skip + "|" + exact
	}
	return []Options{first, rest}, nil
}

// selectedTests are the names of the tests opts.Focus and opts.Skip select.
func selectedTests(ctx context.Context, bin string, opts Options) ([]string, error) {
	res, err := dryRun(ctx, bin, opts)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, t := range res.Tests {
		if t.Outcome == "passed" { // a dry run passes every test it selects
			names = append(names, t.Name)
		}
	}
	return names, nil
}

// dryRun asks e2e.test which tests opts.Focus and opts.Skip select: a
// Ginkgo dry run, which needs no cluster, "passes" each of them.
func dryRun(ctx context.Context, bin string, opts Options) (*Result, error) {
	dir, err := os.MkdirTemp("", "labcloud-e2e-plan-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--ginkgo.dry-run", "--ginkgo.no-color", "--report-dir="+dir,
		"--kubeconfig=/nonexistent", "--ginkgo.focus="+opts.Focus, "--ginkgo.skip="+opts.Skip)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("e2e.test --ginkgo.dry-run: %w: %s", err, firstLine(string(out)))
	}
	ph := opts
	ph.ReportDir = dir
	return readReport(ph)
}

// merge returns r with the tests of later runs in it, a later run's result
// of a test replacing r's (the run that skipped a test for another to run
// lists it too), counted again.
func (r *Result) merge(later ...*Result) *Result {
	out := &Result{Wall: r.Wall}
	byName := map[string]int{}
	for _, res := range append([]*Result{r}, later...) {
		if res != r {
			out.Wall += res.Wall
		}
		for _, t := range res.Tests {
			if i, ok := byName[t.Name]; ok {
				if t.Outcome != "skipped" || out.Tests[i].Outcome == "skipped" {
					out.Tests[i] = t
				}
				continue
			}
			byName[t.Name] = len(out.Tests)
			out.Tests = append(out.Tests, t)
		}
	}
	for _, t := range out.Tests {
		switch t.Outcome {
		case "passed":
			out.Passed++
		case "failed":
			out.Failed++
		default:
			out.Skipped++
		}
	}
	slices.SortStableFunc(out.Tests, func(a, b Test) int { return strings.Compare(a.Name, b.Name) })
	return out
}
