package conformance

import (
	"bytes"
	"cmp"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/lab"
)

// DefaultFocus selects Kubernetes' own tests of a LoadBalancer-capable
// cloud (k8s.io/kubernetes v1.36.3 test/e2e): every [Feature:LoadBalancer]
// test of network/loadbalancer.go, the [sig-network] Services tests of
// network/service.go that create type=LoadBalancer Services, and the
// cloud-provider Node test of cloud/nodes.go.
const DefaultFocus = `\[Feature:LoadBalancer\]` +
	`|\[Feature:CloudProvider\]` +
	`|Services should fail health check node port if there are only terminating endpoints` +
	`|Services should implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes` +
	`|Services should serve endpoints on same port and different protocol for internal traffic on Type LoadBalancer`

// DefaultSkip drops only what cannot apply to the lab; docs/conformance.md gives
// the reason of each: an IPv4 lab (the default) has no IPv6, SCTP is not what it offers,
// flaky tests prove nothing either way, and [Disruptive] tests reboot or
// restart nodes and daemons over SSH, which the lab's guests do not run (the
// cloud Node test is [Disruptive] too, and it can only delete an instance
// through an aws or gce e2e provider: it is listed as skipped).
const DefaultSkip = `IPv6|DualStack|SCTP|\[Flaky\]|\[Disruptive\]`

// SkipFor is the default skip for a lab of the family: DefaultSkip on
// IPv4; an IPv6 lab runs the IPv6 tests, a dual-stack lab the dual-stack
// ones too. An IPv6 lab also skips the tests in ipv6Broken.
func SkipFor(f lab.IPFamily) string {
	switch f {
	case lab.IPv6:
		return `DualStack|SCTP|\[Flaky\]|\[Disruptive\]|` + ipv6Broken
	case lab.DualStack:
		return `SCTP|\[Flaky\]|\[Disruptive\]`
	}
	return DefaultSkip
}

// ipv6Broken are the upstream tests that cannot pass on an IPv6 cluster
// (v1.36.3): "should work from pods" reads the client's address from
// agnhost's "[addr]:port" by cutting at the first colon
// (loadbalancer.go:1280), so it compares "[fd00" with the pod's IP; "source
// ranges" hands the bare IPv6 VIP to wget (service.go:4479), which reads
// fd00:10:123::200 as ftp://fd00/10:123::200 and fails to resolve "fd00".
const ipv6Broken = `ExternalTrafficPolicy: Local .*should work from pods|should only allow access from service loadbalancer source ranges`

// Options choose what `labcloud e2e` runs and where it writes.
type Options struct {
	Focus, Skip string
	// ReportDir receives junit_01.xml, e2e.log and what the tests dump.
	ReportDir string
	// Timeout bounds the whole suite (Ginkgo's own default is one hour).
	Timeout time.Duration
	// Parallel is how many e2e.test processes share the specs (Ginkgo's
	// --procs); 1 runs them one after the other.
	Parallel int
	// Isolate selects tests to run first, beside each other only (when
	// Parallel > 1); empty: none.
	Isolate string
	Out     io.Writer
}

// DefaultParallel runs three processes: the default focus's Local
// rolling update spends a quarter hour mostly waiting out pods' grace
// periods, beside the rest.
const DefaultParallel = 3

// DefaultTimeout bounds a suite whose Options leave Timeout unset.
const DefaultTimeout = 3 * time.Hour

// The e2e client's namespace: e2e.test runs there, behind a veth pair into
// the lab's namespace, from an address outside the nodes' /16. The
// "ExternalTrafficPolicy: Local" tests decide that the client's source IP
// was not preserved when the address a pod sees lies in the /16 of a node's
// InternalIP (loadbalancer.go getSubnetPrefix); the lab's own address on the
// bridge, 10.123.0.1, does. Nodes reach the client through their default
// route (the lab's address on the bridge), so replies need no NAT. An
// IPv6 or dual-stack lab gives the pair IPv6 addresses too, outside the
// bridge's /64 for the same reason.
const (
	E2ENetns       = "labcloud-e2e"
	e2eLabVeth     = "lce2e0" // in the lab's namespace
	e2eClientVeth  = "lce2e1" // in E2ENetns
	e2eLabAddr     = "10.124.0.1"
	e2eClientAddr  = "10.124.0.2"
	e2ePrefix      = "/30"
	e2eLabAddr6    = "fd00:10:124::1"
	e2eClientAddr6 = "fd00:10:124::2"
	e2ePrefix6     = "/64"
)

// Run runs the prebuilt e2e.test of the lab's tools against the running lab
// with its admin kubeconfig, writes the JUnit report into opts.ReportDir and
// returns the result of every selected test. It runs on the host and starts
// e2e.test in E2ENetns, a namespace joined to the lab's, where VIPs,
// NodePorts, pod and node addresses are reachable. The error is non-nil
// when a test failed or the suite could not run.
func Run(ctx context.Context, st *lab.State, opts Options) (res *Result, err error) {
	logger := klog.FromContext(ctx).WithValues("reportDir", opts.ReportDir)
	if st.Light {
		return nil, errors.New("e2e needs real nodes: the light lab has none (labcloud up without --light)")
	}
	bin := filepath.Join(st.Tools, "e2e.test")
	ginkgo := filepath.Join(st.Tools, "ginkgo")
	for _, b := range []string{bin, ginkgo} {
		if _, err := os.Stat(b); err != nil {
			return nil, fmt.Errorf("%s: %w (run make tools)", filepath.Base(b), err)
		}
	}
	if _, _, err := compileFilters(opts.Focus, opts.Skip); err != nil {
		return nil, err
	}
	phases, err := plan(ctx, bin, opts)
	if err != nil {
		return nil, err
	}
	for _, ph := range phases {
		if err := os.MkdirAll(ph.ReportDir, 0o755); err != nil {
			return nil, fmt.Errorf("report dir: %w", err)
		}
		if err := os.Remove(filepath.Join(ph.ReportDir, "junit_01.xml")); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("remove the previous report: %w", err)
		}
	}
	logPath := filepath.Join(opts.ReportDir, "e2e.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("e2e log: %w", err)
	}
	defer logFile.Close()

	labNetns := st.Netns
	if labNetns == "" {
		labNetns = lab.Netns
	}
	cleanup, err := setupClient(ctx, labNetns, E2ENetns, st.IPFamily.HasIPv6())
	defer func() {
		if cerr := cleanup(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("remove the e2e client namespace: %w", cerr))
		}
	}()
	if err != nil {
		return nil, fmt.Errorf("e2e client namespace: %w", err)
	}

	client := e2eClientAddr
	if st.IPFamily.HasIPv6() {
		client += ", " + e2eClientAddr6
	}
	out := io.MultiWriter(opts.Out, logFile)
	deadline := time.Now().Add(cmp.Or(opts.Timeout, DefaultTimeout))
	var results []*Result
	var runErrs []error
	for i, ph := range phases {
		if len(phases) > 1 {
			fmt.Fprintf(out, "run %d of %d: %d processes, report in %s\n", i+1, len(phases), ph.Parallel, ph.ReportDir)
		}
		if ph.Timeout = time.Until(deadline); ph.Timeout <= 0 {
			runErrs = append(runErrs, fmt.Errorf("the suite's time ran out before run %d of %d", i+1, len(phases)))
			break
		}
		args := args(st, bin, ph)
		cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", E2ENetns, ginkgo}, args...)...)
		cmd.Dir = ph.ReportDir
		// kubectl (exec into pods) from the lab's tools; e2e.test runs it by name.
		cmd.Env = append(os.Environ(), "PATH="+st.Tools+":"+os.Getenv("PATH"), "KUBECONFIG="+st.Kubeconfig)
		cmd.Stdout, cmd.Stderr = out, out
		// Ginkgo's runner leaves an interrupt to its processes, as a
		// terminal's Ctrl-C reaches them all: signal the whole group. They
		// clean up on SIGINT.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) }
		cmd.WaitDelay = 2 * time.Minute
		logger.Info("Running e2e.test", "netns", E2ENetns, "args", args)
		fmt.Fprintf(opts.Out, "running in namespace %s (%s): %s %s\n", E2ENetns, client, ginkgo, strings.Join(args, " "))
		start := time.Now()
		if err := cmd.Run(); err != nil {
			runErrs = append(runErrs, fmt.Errorf("e2e.test: %w (log %s)", err, logPath))
		}
		res, err := readReport(ph)
		if err != nil {
			return nil, errors.Join(append(runErrs, fmt.Errorf("%w (log in %s)", err, logPath))...)
		}
		res.Wall = time.Since(start)
		results = append(results, res)
		if ctx.Err() != nil {
			break
		}
	}
	res = results[0].merge(results[1:]...)
	res.Write(opts.Out)
	switch {
	case res.Failed > 0:
		return res, fmt.Errorf("%d of %d tests failed (report %s, log %s)", res.Failed, res.Passed+res.Failed, opts.ReportDir, logPath)
	case len(runErrs) > 0:
		return res, errors.Join(runErrs...)
	}
	return res, nil
}

// readReport reads the JUnit report of one run of Ginkgo's runner.
func readReport(ph Options) (*Result, error) {
	data, err := os.ReadFile(filepath.Join(ph.ReportDir, "junit_01.xml"))
	if err != nil {
		return nil, fmt.Errorf("e2e.test wrote no report: %w", err)
	}
	focus, skip, err := compileFilters(ph.Focus, ph.Skip)
	if err != nil {
		return nil, err
	}
	return ParseJUnit(data, focus, skip)
}

// setupClient makes clientNetns, joined to the lab's namespace labNetns by
// a veth pair, with a default route into the lab (of both families with
// ipv6), and lets the lab forward its traffic (libvirt's routed network
// forwards only its own subnet). The cleanup removes both, and is to be
// called even when setup fails.
func setupClient(ctx context.Context, labNetns, clientNetns string, ipv6 bool) (cleanup func() error, err error) {
	forward := [][]string{
		{"FORWARD", "-i", e2eLabVeth, "-j", "ACCEPT"},
		{"FORWARD", "-o", e2eLabVeth, "-j", "ACCEPT"},
	}
	// Rules of both families are removed whatever this run's: a crashed
	// run of another family may have left them.
	cleanup = func() error {
		var errs []error
		for _, tables := range []string{"iptables", "ip6tables"} {
			for _, rule := range forward {
				// Delete every copy: a crashed run may have left one.
				for run(context.Background(), "ip", append([]string{"netns", "exec", labNetns, tables, "-C"}, rule...)...) == nil {
					if err := run(context.Background(), "ip", append([]string{"netns", "exec", labNetns, tables, "-D"}, rule...)...); err != nil {
						errs = append(errs, err)
						break
					}
				}
			}
		}
		if _, err := os.Stat(filepath.Join("/run/netns", clientNetns)); err == nil {
			// Deleting the namespace deletes the veth pair.
			if err := run(context.Background(), "ip", "netns", "del", clientNetns); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	if err := cleanup(); err != nil { // a leftover of a crashed run
		return cleanup, err
	}
	steps := [][]string{
		{"ip", "netns", "add", clientNetns},
		{"ip", "-n", clientNetns, "link", "set", "lo", "up"},
		{"ip", "-n", labNetns, "link", "add", e2eLabVeth, "type", "veth", "peer", "name", e2eClientVeth, "netns", clientNetns},
		{"ip", "-n", labNetns, "addr", "add", e2eLabAddr + e2ePrefix, "dev", e2eLabVeth},
		{"ip", "-n", labNetns, "link", "set", e2eLabVeth, "up"},
		{"ip", "-n", clientNetns, "addr", "add", e2eClientAddr + e2ePrefix, "dev", e2eClientVeth},
		{"ip", "-n", clientNetns, "link", "set", e2eClientVeth, "up"},
		{"ip", "-n", clientNetns, "route", "add", "default", "via", e2eLabAddr},
	}
	for _, rule := range forward {
		steps = append(steps, append([]string{"ip", "netns", "exec", labNetns, "iptables", "-I"}, rule...))
	}
	if ipv6 {
		steps = append(steps,
			// No duplicate address detection: the pair's two ends are all
			// that is on the link, and the tests start at once.
			[]string{"ip", "-n", labNetns, "addr", "add", e2eLabAddr6 + e2ePrefix6, "dev", e2eLabVeth, "nodad"},
			[]string{"ip", "-n", clientNetns, "addr", "add", e2eClientAddr6 + e2ePrefix6, "dev", e2eClientVeth, "nodad"},
			[]string{"ip", "-n", clientNetns, "-6", "route", "add", "default", "via", e2eLabAddr6})
		for _, rule := range forward {
			steps = append(steps, append([]string{"ip", "netns", "exec", labNetns, "ip6tables", "-I"}, rule...))
		}
	}
	for _, s := range steps {
		if err := run(ctx, s[0], s[1:]...); err != nil {
			return cleanup, err
		}
	}
	return cleanup, nil
}

// run runs a command and returns its output in the error when it fails.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// args is the command line of Ginkgo's runner for the lab: its own flags,
// the prebuilt suite bin, and e2e.test's flags after "--".
func args(st *lab.State, bin string, opts Options) []string {
	timeout := cmp.Or(opts.Timeout, DefaultTimeout)
	return []string{
		fmt.Sprintf("--procs=%d", max(opts.Parallel, 1)),
		"--focus=" + opts.Focus,
		"--skip=" + opts.Skip,
		"--timeout=" + timeout.String(),
		"--no-color",
		"-v",
		bin, "--",
		"--kubeconfig=" + st.Kubeconfig,
		// skeleton: a cluster the suite knows nothing special about (the
		// default when unset, said here so the log says so).
		"--provider=skeleton",
		fmt.Sprintf("--num-nodes=%d", len(st.Nodes)),
		"--report-dir=" + opts.ReportDir,
		"--e2e-output-dir=" + opts.ReportDir,
		"--kubectl-path=" + filepath.Join(st.Tools, "kubectl"),
		// The lab's nodes are Debian-built guests but no SSH: no log dump.
		"--disable-log-dump",
	}
}

func compileFilters(focus, skip string) (*regexp.Regexp, *regexp.Regexp, error) {
	f, err := regexp.Compile(focus)
	if err != nil {
		return nil, nil, fmt.Errorf("--focus: %w", err)
	}
	var s *regexp.Regexp
	if skip != "" {
		if s, err = regexp.Compile(skip); err != nil {
			return nil, nil, fmt.Errorf("--skip: %w", err)
		}
	}
	return f, s, nil
}

// Result is the outcome of one e2e.test run.
type Result struct {
	Tests                   []Test
	Passed, Failed, Skipped int
	Wall                    time.Duration
}

// Test is one selected test (or a failed suite node) of a run.
type Test struct {
	Name    string
	Outcome string // passed, failed, skipped
	// Reason says why a test was skipped: its own Skip message, or that
	// the --skip pattern excluded it.
	Reason  string
	Seconds float64
}

// Summary is the one-line summary `labcloud e2e` ends with.
func (r *Result) Summary() string {
	return fmt.Sprintf("%d passed, %d failed, %d skipped", r.Passed, r.Failed, r.Skipped)
}

// Write prints every selected test with its outcome and time, the slowest
// tests and, last, the summary line.
func (r *Result) Write(w io.Writer) {
	fmt.Fprintf(w, "\n%-8s %8s  %s\n", "RESULT", "SECONDS", "TEST")
	for _, t := range r.Tests {
		line := fmt.Sprintf("%-8s %8.1f  %s", t.Outcome, t.Seconds, t.Name)
		if t.Reason != "" {
			line += "  (" + t.Reason + ")"
		}
		fmt.Fprintln(w, line)
	}
	if slow := r.Slowest(3); len(slow) > 0 {
		fmt.Fprintln(w, "\nslowest:")
		for _, t := range slow {
			fmt.Fprintf(w, "  %7.1fs  %s\n", t.Seconds, t.Name)
		}
	}
	if r.Wall > 0 {
		fmt.Fprintf(w, "wall time: %s\n", r.Wall.Round(time.Second))
	}
	fmt.Fprintln(w, r.Summary())
}

// Slowest returns the n longest tests that ran, longest first.
func (r *Result) Slowest(n int) []Test {
	var ran []Test
	for _, t := range r.Tests {
		if t.Outcome != "skipped" {
			ran = append(ran, t)
		}
	}
	slices.SortStableFunc(ran, func(a, b Test) int {
		switch {
		case a.Seconds > b.Seconds:
			return -1
		case a.Seconds < b.Seconds:
			return 1
		}
		return 0
	})
	return ran[:min(n, len(ran))]
}

// The parts of Ginkgo's JUnit report (reporters.GenerateJUnitReport, as
// e2e.test writes it into junit_01.xml) the summary needs.
type junitSuites struct {
	Suites []struct {
		Cases []junitCase `xml:"testcase"`
	} `xml:"testsuite"`
}

type junitCase struct {
	Name    string  `xml:"name,attr"`
	Status  string  `xml:"status,attr"`
	Time    float64 `xml:"time,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
}

// ParseJUnit reads e2e.test's JUnit report. The report lists every spec
// of the suite: one the filters left out is "skipped" with the bare message
// "skipped", one that skipped itself carries "skipped - <reason>". The
// result holds the specs the run selected (those that ran or skipped
// themselves, and those it never reached because the suite was interrupted
// or aborted), the specs matching focus that only the skip pattern left
// out (all counted as skipped), and any suite node ([SynchronizedBeforeSuite],
// [ReportAfterSuite], ...) that failed, counted as a failure.
func ParseJUnit(data []byte, focus, skip *regexp.Regexp) (*Result, error) {
	var doc junitSuites
	if err := xml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("JUnit report: %w", err)
	}
	if len(doc.Suites) == 0 {
		return nil, errors.New("JUnit report: no testsuite")
	}
	res := &Result{}
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
			kind, text := splitLeafType(c.Name)
			t := Test{Name: text, Seconds: c.Time}
			switch {
			case c.Status == "passed":
				if kind != "It" {
					continue // a suite node that worked: not a test
				}
				t.Outcome = "passed"
				res.Passed++
			case c.Status == "skipped" || c.Status == "pending":
				msg := ""
				if c.Skipped != nil {
					msg = c.Skipped.Message
				}
				reason, selfSkipped := strings.CutPrefix(msg, "skipped - ")
				switch {
				case kind != "It":
					continue
				case selfSkipped:
					t.Reason = firstLine(reason)
				case focus == nil || !focus.MatchString(text):
					continue // not selected
				case skip != nil && skip.MatchString(text):
					t.Reason = "left out by --skip"
				default: // selected, but the suite ended first
					t.Reason = "not run: the suite was interrupted or aborted"
				}
				t.Outcome = "skipped"
				res.Skipped++
			default: // failed, timedout, panicked, interrupted, aborted
				t.Outcome = "failed"
				if c.Status != "failed" {
					t.Reason = c.Status
				}
				if kind != "It" {
					t.Name = "[" + kind + "] " + text
				}
				res.Failed++
			}
			res.Tests = append(res.Tests, t)
		}
	}
	slices.SortStableFunc(res.Tests, func(a, b Test) int { return strings.Compare(a.Name, b.Name) })
	return res, nil
}

// splitLeafType splits "[It] text" into "It" and "text".
func splitLeafType(name string) (kind, text string) {
	if rest, ok := strings.CutPrefix(name, "["); ok {
		if k, t, ok := strings.Cut(rest, "]"); ok {
			return k, strings.TrimSpace(t)
		}
	}
	return "", name
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
