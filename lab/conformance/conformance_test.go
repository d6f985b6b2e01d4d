package conformance

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/controlplane"
)

// A report in the shape e2e.test writes (Ginkgo's JUnit reporter with the
// e2e framework's options): every spec of the suite is a testcase.
const junitFixture = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="7" disabled="0" errors="1" failures="2" time="600">
  <testsuite name="Kubernetes e2e suite" package="/work" tests="9" disabled="0" skipped="4" errors="1" failures="2" time="600" timestamp="2026-11-22T13:48:14">
    <properties><property name="SuiteSucceeded" value="false"></property></properties>
    <testcase name="[It] [sig-apps] Deployment should run the lifecycle of a Deployment [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] [sig-cloud-provider] [Feature:CloudProvider] [Disruptive] Nodes should be deleted on API server if it doesn&#39;t exist in the cloud provider" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] [sig-network] LoadBalancers ExternalTrafficPolicy: Local [Feature:LoadBalancer] [Slow] should work for type=LoadBalancer" classname="Kubernetes e2e suite" status="passed" time="95.5"></testcase>
    <testcase name="[It] [sig-network] LoadBalancers [Feature:LoadBalancer] should be able to change the type and ports of a TCP service [Slow]" classname="Kubernetes e2e suite" status="failed" time="300.25">
      <failure message="" type="failed">[FAILED] timed out waiting for the condition
In [It] at: loadbalancer.go:200</failure>
    </testcase>
    <testcase name="[It] [sig-network] LoadBalancers [Feature:LoadBalancer] should only allow access from service loadbalancer source ranges [Slow]" classname="Kubernetes e2e suite" status="skipped" time="12">
      <skipped message="skipped - Test requires &gt;= 2 Ready nodes, but there are only 1 nodes&#xA;more detail"></skipped>
    </testcase>
    <testcase name="[It] [sig-network] LoadBalancers [Feature:LoadBalancer] should handle load balancer cleanup finalizer for service [Slow]" classname="Kubernetes e2e suite" status="timedout" time="900">
      <failure message="" type="timedout">timed out</failure>
    </testcase>
    <testcase name="[It] [sig-network] LoadBalancers [Feature:LoadBalancer] should be able to create LoadBalancer Service without NodePort and change it [Slow]" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="3"></testcase>
    <testcase name="[ReportAfterSuite] Kubernetes e2e suite report" classname="Kubernetes e2e suite" status="panicked" time="0">
      <error message="boom" type="panicked">stack</error>
    </testcase>
  </testsuite>
</testsuites>`

func TestParseE2EJUnit(t *testing.T) {
	focus := regexp.MustCompile(DefaultFocus)
	skip := regexp.MustCompile(DefaultSkip)
	res, err := ParseJUnit([]byte(junitFixture), focus, skip)
	if err != nil {
		t.Fatal(err)
	}
	want := []Test{
		{Name: "[ReportAfterSuite] Kubernetes e2e suite report", Outcome: "failed", Reason: "panicked"},
		{Name: "[sig-cloud-provider] [Feature:CloudProvider] [Disruptive] Nodes should be deleted on API server if it doesn't exist in the cloud provider", Outcome: "skipped", Reason: "left out by --skip"},
		{Name: "[sig-network] LoadBalancers ExternalTrafficPolicy: Local [Feature:LoadBalancer] [Slow] should work for type=LoadBalancer", Outcome: "passed", Seconds: 95.5},
		{Name: "[sig-network] LoadBalancers [Feature:LoadBalancer] should be able to change the type and ports of a TCP service [Slow]", Outcome: "failed", Seconds: 300.25},
		{Name: "[sig-network] LoadBalancers [Feature:LoadBalancer] should be able to create LoadBalancer Service without NodePort and change it [Slow]", Outcome: "skipped", Reason: "not run: the suite was interrupted or aborted"},
		{Name: "[sig-network] LoadBalancers [Feature:LoadBalancer] should handle load balancer cleanup finalizer for service [Slow]", Outcome: "failed", Reason: "timedout", Seconds: 900},
		{Name: "[sig-network] LoadBalancers [Feature:LoadBalancer] should only allow access from service loadbalancer source ranges [Slow]", Outcome: "skipped", Reason: "Test requires >= 2 Ready nodes, but there are only 1 nodes", Seconds: 12},
	}
	if len(res.Tests) != len(want) {
		t.Fatalf("got %d tests, want %d: %+v", len(res.Tests), len(want), res.Tests)
	}
	for i := range want {
		if res.Tests[i] != want[i] {
			t.Errorf("test %d:\n got %+v\nwant %+v", i, res.Tests[i], want[i])
		}
	}
	if got, want := res.Summary(), "1 passed, 3 failed, 3 skipped"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
	slow := res.Slowest(2)
	if len(slow) != 2 || slow[0].Seconds != 900 || slow[1].Seconds != 300.25 {
		t.Errorf("slowest: %+v", slow)
	}

	// Specs that ran count whatever the focus; one that did not run and
	// that the focus does not match was not selected.
	res, err = ParseJUnit([]byte(junitFixture), regexp.MustCompile(`source ranges|type=LoadBalancer`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := res.Summary(), "1 passed, 3 failed, 1 skipped"; got != want {
		t.Errorf("narrow focus: summary %q, want %q: %+v", got, want, res.Tests)
	}
}

func TestParseE2EJUnitRejects(t *testing.T) {
	for name, data := range map[string]string{
		"not XML":    "passed",
		"no suite":   "<testsuites></testsuites>",
		"truncated":  junitFixture[:len(junitFixture)/2],
		"empty file": "",
	} {
		if _, err := ParseJUnit([]byte(data), regexp.MustCompile("x"), nil); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// The acceptance check greps the last summary line of labcloud e2e's output.
var summaryLine = regexp.MustCompile(`^([A-Za-z]+: )?[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$`)

func TestE2EResultWriteEndsWithSummary(t *testing.T) {
	res, err := ParseJUnit([]byte(junitFixture), regexp.MustCompile(DefaultFocus), regexp.MustCompile(DefaultSkip))
	if err != nil {
		t.Fatal(err)
	}
	res.Wall = 21*time.Minute + 3*time.Second
	var b bytes.Buffer
	res.Write(&b)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if last := lines[len(lines)-1]; !summaryLine.MatchString(last) || last != res.Summary() {
		t.Errorf("last line %q is not the summary %q", last, res.Summary())
	}
	for _, want := range []string{"wall time: 21m3s", "timedout", "left out by --skip", "failed      300.2  [sig-network] LoadBalancers"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
}

func TestE2EArgs(t *testing.T) {
	st := &lab.State{Kubeconfig: "/lab/admin.kubeconfig", Tools: "/tools", Nodes: []string{"a", "b", "c"}}
	got := args(st, "/tools/e2e.test", Options{Focus: "F", Skip: "S", ReportDir: "/r", Parallel: 3})
	suite := slices.Index(got, "/tools/e2e.test")
	if suite < 0 || suite+1 >= len(got) || got[suite+1] != "--" {
		t.Fatalf("args do not hand the suite to Ginkgo as \"/tools/e2e.test --\": %q", got)
	}
	runner, own := strings.Join(got[:suite], "\n")+"\n", strings.Join(got[suite+2:], "\n")+"\n"
	for _, want := range []string{"--procs=3", "--focus=F", "--skip=S", "--timeout=3h0m0s"} {
		if !strings.Contains(runner, want+"\n") {
			t.Errorf("Ginkgo's flags lack %s: %q", want, got[:suite])
		}
	}
	for _, want := range []string{"--kubeconfig=/lab/admin.kubeconfig", "--num-nodes=3", "--report-dir=/r", "--kubectl-path=/tools/kubectl"} {
		if !strings.Contains(own, want+"\n") {
			t.Errorf("e2e.test's flags lack %s: %q", want, got[suite+2:])
		}
	}
	if p := args(st, "/b", Options{})[0]; p != "--procs=1" {
		t.Errorf("unset Parallel gives %s, want --procs=1", p)
	}
}

// TestE2EDefaultSelection asks the real e2e.test (a Ginkgo dry run, no
// cluster) which specs the default focus and skip select, and reads its
// real JUnit report: the 17 [Feature:LoadBalancer] tests, the 3 Services
// tests of LoadBalancer Services, and the cloud Node test listed as left
// out.
func TestE2EDefaultSelection(t *testing.T) {
	res, err := dryRun(context.Background(), e2eTestBin(t), Options{Focus: DefaultFocus, Skip: DefaultSkip})
	if err != nil {
		t.Fatal(err)
	}
	lb, services := 0, 0
	for _, tc := range res.Tests {
		switch {
		case tc.Outcome == "passed" && strings.Contains(tc.Name, "[Feature:LoadBalancer]"):
			lb++
		case tc.Outcome == "passed" && strings.HasPrefix(tc.Name, "[sig-network] Services "):
			services++
		case tc.Outcome == "skipped" && strings.Contains(tc.Name, "[Feature:CloudProvider]") && tc.Reason == "left out by --skip":
		default:
			t.Errorf("unexpected: %+v", tc)
		}
	}
	if lb != 17 || services != 3 || res.Summary() != "20 passed, 0 failed, 1 skipped" {
		t.Errorf("selected %d LoadBalancer and %d Services tests (%s), want 17 and 3: %+v", lb, services, res.Summary(), res.Tests)
	}
}

// TestSetupE2EClient joins a client namespace to a stand-in for the lab's
// namespace and checks that the client reaches an address on the lab's
// side, of both families, only while it is set up, and that cleanup leaves
// nothing behind.
func TestSetupE2EClient(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, iptables)")
	}
	for _, prog := range []string{"iptables", "ip6tables", "busybox"} {
		if _, err := exec.LookPath(prog); err != nil {
			t.Skipf("no %s (hack/install-deps.sh)", prog)
		}
	}
	ctx := context.Background()
	labNs, clientNs := fmt.Sprintf("lc-e2etest-lab-%d", os.Getpid()), fmt.Sprintf("lc-e2etest-client-%d", os.Getpid())
	if err := run(ctx, "ip", "netns", "add", labNs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = run(context.Background(), "ip", "netns", "del", labNs) })
	// The lab's bridge address, on a bridge without ports.
	for _, s := range [][]string{
		{"ip", "-n", labNs, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", labNs, "addr", "add", lab.Addressing{}.Gateway() + "/24", "dev", "br0"},
		{"ip", "-n", labNs, "addr", "add", lab.Gateway6 + "/64", "dev", "br0", "nodad"},
		{"ip", "-n", labNs, "link", "set", "br0", "up"},
	} {
		if err := run(ctx, s[0], s[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	ping := func(addr string) error {
		return run(ctx, "ip", "netns", "exec", clientNs, "busybox", "ping", "-c1", "-w10", addr)
	}
	cleanup, err := setupClient(ctx, labNs, clientNs, true)
	if err != nil {
		_ = cleanup()
		t.Fatal(err)
	}
	for _, a := range []string{lab.Addressing{}.Gateway(), lab.Gateway6} {
		if err := ping(a); err != nil {
			t.Errorf("client cannot reach the lab at %s: %v", a, err)
		}
	}
	rules := func() string {
		out, _ := exec.Command("ip", "netns", "exec", labNs, "iptables", "-S", "FORWARD").CombinedOutput()
		out6, _ := exec.Command("ip", "netns", "exec", labNs, "ip6tables", "-S", "FORWARD").CombinedOutput()
		return string(out) + string(out6)
	}
	if r := rules(); strings.Count(r, "-i "+e2eLabVeth+" -j ACCEPT") != 2 {
		t.Errorf("want a forward rule for the client in each family: %s", r)
	}
	// A second setup (after a crash) starts from scratch; IPv4 only
	// removes the IPv6 rules of the run before too.
	if cleanup, err = setupClient(ctx, labNs, clientNs, false); err != nil {
		t.Fatalf("second setup: %v", err)
	}
	if err := cleanup(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/run/netns", clientNs)); err == nil {
		t.Error("client namespace left behind")
	}
	if r := rules(); strings.Contains(r, e2eLabVeth) {
		t.Errorf("forward rules left behind: %s", r)
	}
	if out, err := exec.Command("ip", "-n", labNs, "link", "show", e2eLabVeth).CombinedOutput(); err == nil {
		t.Errorf("veth left behind: %s", out)
	}
}

// Each family skips only the tests it cannot run.
func TestSkipFor(t *testing.T) {
	for _, tc := range []struct {
		f       lab.IPFamily
		skipped []string
		run     []string
	}{
		{"", []string{"[Feature:IPv6DualStack] x", "x (IPv6)", "SCTP x"}, []string{"[Feature:LoadBalancer] x"}},
		{lab.IPv4, []string{"[Feature:IPv6DualStack] x", "x (IPv6)"}, []string{"[Feature:LoadBalancer] x"}},
		{lab.IPv6, []string{"[Feature:IPv6DualStack] x", "[Flaky] x", "[sig-network] LoadBalancers ExternalTrafficPolicy: Local [Feature:LoadBalancer] [Slow] should work from pods",
			"[sig-network] LoadBalancers [Feature:LoadBalancer] should only allow access from service loadbalancer source ranges [Slow]"},
			[]string{"x (IPv6)", "[Feature:LoadBalancer] x", "[sig-network] LoadBalancers ExternalTrafficPolicy: Local [Feature:LoadBalancer] should work for type=LoadBalancer"}},
		{lab.DualStack, []string{"[Disruptive] x", "SCTP x"}, []string{"[Feature:IPv6DualStack] x", "x (IPv6)"}},
	} {
		re := regexp.MustCompile(SkipFor(tc.f))
		for _, s := range tc.skipped {
			if !re.MatchString(s) {
				t.Errorf("%q: %q not skipped", tc.f, s)
			}
		}
		for _, s := range tc.run {
			if re.MatchString(s) {
				t.Errorf("%q: %q skipped", tc.f, s)
			}
		}
	}
}

// e2eTestBin is the tools' e2e.test; the test skips without it.
func e2eTestBin(t *testing.T) string {
	t.Helper()
	tools, err := controlplane.FindTools()
	if err != nil {
		t.Skipf("no tools: %v", err)
	}
	bin := filepath.Join(tools, "e2e.test")
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no e2e.test: %v", err)
	}
	return bin
}
