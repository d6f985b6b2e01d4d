package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/libvirtd"
)

// The test binary doubles as labcloud, so that a test can check the exit
// status of the real main without building it.
const asMainEnv = "LABCLOUD_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// host is what a rejected command must leave as it found it: the lab's
// namespace (absent, or the very same one), the host lock file, and no
// lock held by this process.
type host struct {
	netns, lockFile string
}

func fileID(path string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return "absent"
	}
	return fmt.Sprintf("dev %d inode %d ctime %d.%d", st.Dev, st.Ino, st.Ctim.Sec, st.Ctim.Nsec)
}

func hostNow() host {
	return host{netns: fileID(filepath.Join("/run/netns", lab.Netns)), lockFile: fileID(libvirtd.LockPath)}
}

// lockHeld reports whether this process has the host lock file open.
func lockHeld(t *testing.T) bool {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("list open files: %v", err)
	}
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && target == libvirtd.LockPath {
			return true
		}
	}
	return false
}

// run runs labcloud in this process, with a deadline: even a command that
// wrongly went ahead could only wait for the host lock that long.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := root()
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

// noTools empties PATH: without ip(8) and flock(1), even a command that
// wrongly went past its checks could not make a namespace or hold a lock.
func noTools(t *testing.T) { t.Setenv("PATH", t.TempDir()) }

func TestBadFlagsTouchNothing(t *testing.T) {
	noTools(t)
	dir := t.TempDir()
	badConfig := filepath.Join(dir, "cc.yaml")
	if err := os.WriteFile(badConfig, []byte("region: lab\nroutes: {bridge: virbr0}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	malformed := filepath.Join(dir, "malformed.yaml")
	if err := os.WriteFile(malformed, []byte("regoin: lab\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want []string // the flag and the value, at least
	}{
		{[]string{"up", "--light", "--nodes", "0"}, []string{"--nodes 0"}},
		{[]string{"up", "--light", "--nodes", "10001"}, []string{"--nodes 10001"}},
		{[]string{"up", "--nodes", "0"}, []string{"--nodes 0"}},
		{[]string{"up", "--nodes", "101"}, []string{"--nodes 101"}},
		{[]string{"up", "--nodes", "-3"}, []string{"--nodes -3"}},
		{[]string{"up", "--wait", "0s"}, []string{"--wait 0s"}},
		{[]string{"up", "--wait", "-5m"}, []string{"--wait -5m0s"}},
		{[]string{"up", "--wait", "soon"}, []string{"--wait", "soon"}},
		{[]string{"up", "--ip-family", "v6"}, []string{"--ip-family v6", "ipv4, ipv6 or dual"}},
		{[]string{"up", "--ip-family", ""}, []string{"--ip-family", "ipv4, ipv6 or dual"}},
		{[]string{"up", "--light", "--ip-family", "dual"}, []string{"--ip-family dual", "--light"}},
		{[]string{"up", "--subnet", "10.77.0.0/16"}, []string{"--subnet 10.77.0.0/16", "/24"}},
		{[]string{"up", "--pod-cidr", "10.123.0.0/16"}, []string{"--pod-cidr 10.123.0.0/16", "network 10.123.0.0/24"}},
		{[]string{"up", "--light", "--subnet", "10.77.0.0/24"}, []string{"--subnet 10.77.0.0/24", "full lab"}},
		{[]string{"up", "--ccm-flag=v=4"}, []string{"--ccm-flag v=4"}},
		{[]string{"up", "--ccm-flag=--leader-elect=false"}, []string{"--ccm-flag --leader-elect=false"}},
		{[]string{"up", "--ccm-flag=--cloud-config=/etc/x"}, []string{"--ccm-flag --cloud-config=/etc/x"}},
		{[]string{"up", "--cloud-config", "/nonexistent/cc.yaml"}, []string{"--cloud-config /nonexistent/cc.yaml"}},
		{[]string{"up", "--cloud-config", badConfig}, []string{"--cloud-config " + badConfig, "routes.bridge", "virbr0"}},
		{[]string{"up", "--cloud-config", malformed}, []string{"--cloud-config " + malformed, "regoin"}},
		{[]string{"up", "--light", "--cloud-config", badConfig}, []string{"--cloud-config " + badConfig, "full lab"}},
		{[]string{"up", "--host-listener-fd", "1"}, []string{"--host-listener-fd 1"}},
		{[]string{"up", "extra"}, []string{"extra"}},
		{[]string{"up", "--no-such-flag"}, []string{"--no-such-flag"}},
		{[]string{"up", "--logs-on-failure", badConfig}, []string{"--logs-on-failure " + badConfig}},
		{[]string{"up", "--logs-on-failure", "/nonexistent/a/b"}, []string{"--logs-on-failure /nonexistent/a/b"}},
		{[]string{"status", "-o", "yaml"}, []string{"--output yaml"}},
		{[]string{"bench", "--runs", "0"}, []string{"--runs 0"}},
		{[]string{"bench", "--output", "/nonexistent/b.json"}, []string{"--output /nonexistent/b.json"}},
		{[]string{"bench", "--output", dir}, []string{"--output " + dir, "directory"}},
		{[]string{"chaos", "--duration", "0s"}, []string{"--duration 0s"}},
		{[]string{"chaos", "--json", "/nonexistent/c.json"}, []string{"--json /nonexistent/c.json"}},
		{[]string{"e2e", "--focus", "("}, []string{"--focus ("}},
		{[]string{"e2e", "--skip", "[x"}, []string{"--skip [x"}},
		{[]string{"e2e", "--timeout", "0s"}, []string{"--timeout 0s"}},
		{[]string{"e2e", "--junit-dir", badConfig}, []string{"--junit-dir " + badConfig}},
		{[]string{"export", "logs", badConfig}, []string{"DIR " + badConfig}},
		{[]string{"export", "logs", "/nonexistent/a/b"}, []string{"DIR /nonexistent/a/b"}},
		{[]string{"logs", "a", "b"}, []string{"at most 1 arg"}},
		{[]string{"node", "stop"}, []string{"1 arg"}},
		{[]string{"simulate", "--nodes", "0", "--heartbeat", "1s", "--kubeconfig", badConfig}, []string{"--nodes 0"}},
		{[]string{"simulate", "--nodes", "1", "--heartbeat", "0s", "--kubeconfig", badConfig}, []string{"--heartbeat 0s"}},
		{[]string{"simulate", "--nodes", "1", "--heartbeat", "1s", "--kubeconfig", "/nonexistent"}, []string{"--kubeconfig /nonexistent"}},
		{[]string{"forward", "--listen-fd", "0", "--to", "10.123.0.1:6443"}, []string{"--listen-fd 0"}},
		{[]string{"forward", "--listen-fd", "3", "--to", "10.123.0.1"}, []string{"--to 10.123.0.1"}},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			before := hostNow()
			out, err := run(t, append([]string{"--state-dir", state}, tt.args...)...)
			if err == nil {
				t.Fatalf("accepted; output:\n%s", out)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			if _, serr := os.Stat(state); serr == nil {
				t.Errorf("a rejected command made the state directory %s", state)
			}
			if after := hostNow(); after != before {
				t.Errorf("a rejected command changed the host: namespace %s -> %s, lock file %s -> %s", before.netns, after.netns, before.lockFile, after.lockFile)
			}
			if lockHeld(t) {
				t.Error("a rejected command holds the host lock")
			}
		})
	}
}

// The real main: a rejected flag is a non-zero exit naming the flag.
func TestBadFlagExitStatus(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	before := hostNow()
	cmd := exec.Command(os.Args[0], "--state-dir", state, "up", "--light", "--nodes", "0")
	cmd.Env = append(os.Environ(), asMainEnv+"=1", "PATH="+t.TempDir())
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("labcloud up --light --nodes 0: %v, want exit status 1; output:\n%s", err, out)
	}
	if !strings.Contains(string(out), "--nodes 0") {
		t.Errorf("output does not name --nodes 0:\n%s", out)
	}
	if _, err := os.Stat(state); err == nil {
		t.Error("state directory made")
	}
	if hostNow() != before {
		t.Error("the host's lab namespace or lock file changed")
	}
}

// fakeLab writes the state of a lab that is up, with some logs, without
// running anything.
func fakeLab(t *testing.T, light bool) (dir string, st *lab.State) {
	t.Helper()
	dir = t.TempDir()
	st = &lab.State{Dir: dir, Netns: lab.Netns, Kubeconfig: filepath.Join(dir, "admin.kubeconfig"), HostKubeconfig: filepath.Join(dir, "kubeconfig"),
		Nodes: []string{"lab-node-1", "lab-node-2"}, Light: light, Pids: map[string]int{}}
	data, _ := json.Marshal(st)
	for name, content := range map[string]string{
		"state.json": string(data), "ccm.log": "I'm the CCM\n", "nodes/lab-node-2.console": "lab-init: sysinit done\n",
		"kubeconfig": "host kubeconfig\n", "admin.kubeconfig": "internal kubeconfig\n",
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir, st
}

// TestFailedUpExportsLogs: a failed up says where its logs export went
// and writes the host's files there even when the cluster cannot be
// asked; with --keep-on-failure it removes nothing. The part run in the
// lab's namespace is refused (as from inside it), so no lab is touched.
func TestFailedUpExportsLogs(t *testing.T) {
	t.Setenv(insideEnv, "1")
	t.Setenv("TMPDIR", t.TempDir())
	dir, _ := fakeLab(t, false)
	for _, tt := range []struct{ name, logs string }{
		{"--logs-on-failure", filepath.Join(t.TempDir(), "logs")},
		{"a new temporary directory", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var w bytes.Buffer
			afterFailedUp(context.Background(), &w, dir, tt.logs, true)
			out := w.String()
			first, _, _ := strings.Cut(out, "\n")
			logs, ok := strings.CutPrefix(first, "logs of the failed up: ")
			if !ok || (tt.logs != "" && logs != tt.logs) || (tt.logs == "" && !strings.HasPrefix(filepath.Base(logs), "labcloud-up-failed-")) {
				t.Fatalf("first line %q does not name the logs directory; output:\n%s", first, out)
			}
			if data, err := os.ReadFile(filepath.Join(logs, "ccm.log")); err != nil || string(data) != "I'm the CCM\n" {
				t.Errorf("ccm.log in the export = %q, %v", data, err)
			}
			if !strings.Contains(out, "export incomplete: the cluster's objects, events and status: already inside") {
				t.Errorf("the export's failure is not said:\n%s", out)
			}
			if strings.Contains(out, "removing") {
				t.Errorf("with keep, the failed lab is removed:\n%s", out)
			}
			if _, err := os.Stat(filepath.Join(dir, "state.json")); err != nil {
				t.Errorf("with keep, the lab's state is gone: %v", err)
			}
		})
	}
}

func TestFailedUpWithoutState(t *testing.T) {
	var w bytes.Buffer
	afterFailedUp(context.Background(), &w, t.TempDir(), "", true)
	if !strings.HasPrefix(w.String(), "no logs of the failed up to export: ") {
		t.Errorf("output = %q", w.String())
	}
}

// TestExportBeforeControlPlane: an up that failed before its control
// plane ran has only the host's files, and that export is complete.
func TestExportBeforeControlPlane(t *testing.T) {
	t.Setenv(insideEnv, "1") // the namespace part, if tried, fails
	dir, st := fakeLab(t, false)
	st.Kubeconfig = ""
	out := t.TempDir()
	if err := exportLogs(context.Background(), dir, st, out); err != nil {
		t.Fatalf("exportLogs: %v", err)
	}
	if _, err := os.Stat(filepath.Join(out, "ccm.log")); err != nil {
		t.Error(err)
	}
}

func TestNodeAndLogsNamesChecked(t *testing.T) {
	noTools(t)
	dir, _ := fakeLab(t, false)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"node", "stop", "lab-node-9"}, `"lab-node-9": not a node of this lab (lab-node-1, lab-node-2)`},
		{[]string{"node", "delete", "etcd"}, `"etcd": not a node`},
		{[]string{"logs", "kubelet"}, `no component "kubelet"`},
		{[]string{"logs", "-f"}, "-f"},
	} {
		if out, err := run(t, append([]string{"--state-dir", dir}, tt.args...)...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: err = %v, want %q; output %s", tt.args, err, tt.want, out)
		}
	}
	light, _ := fakeLab(t, true)
	if _, err := run(t, "--state-dir", light, "node", "stop", "lab-node-1"); err == nil || !strings.Contains(err.Error(), "light") {
		t.Errorf("node stop in a light lab: %v, want an error saying it is light", err)
	}
}

func TestLogs(t *testing.T) {
	dir, _ := fakeLab(t, false)
	out, err := run(t, "--state-dir", dir, "logs")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"COMPONENT", "ccm (libvirt-cloud-controller-manager)", filepath.Join(dir, "ccm.log"), "12 bytes", "lab-node-2", "etcd", "not written yet"} {
		if !strings.Contains(out, w) {
			t.Errorf("logs list lacks %q:\n%s", w, out)
		}
	}
	for name, want := range map[string]string{"ccm": "I'm the CCM\n", "libvirt-cloud-controller-manager": "I'm the CCM\n", "lab-node-2": "lab-init: sysinit done\n"} {
		if out, err := run(t, "--state-dir", dir, "logs", name); err != nil || out != want {
			t.Errorf("logs %s = %q, %v; want %q", name, out, err, want)
		}
	}
	if _, err := run(t, "--state-dir", dir, "logs", "etcd"); err == nil {
		t.Error("logs of a file not written yet: want an error")
	}
}

func TestKubeconfig(t *testing.T) {
	dir, _ := fakeLab(t, false)
	if out, err := run(t, "--state-dir", dir, "kubeconfig"); err != nil || out != "host kubeconfig\n" {
		t.Errorf("kubeconfig = %q, %v", out, err)
	}
	if out, err := run(t, "--state-dir", dir, "kubeconfig", "--internal"); err != nil || out != "internal kubeconfig\n" {
		t.Errorf("kubeconfig --internal = %q, %v", out, err)
	}
	if _, err := run(t, "--state-dir", filepath.Join(dir, "none"), "kubeconfig"); err == nil || !strings.Contains(err.Error(), "no lab is up") {
		t.Errorf("kubeconfig without a lab: %v", err)
	}
}

func TestCompletion(t *testing.T) {
	dir, _ := fakeLab(t, false)
	for _, tt := range []struct {
		args      []string
		want, not []string
	}{
		{[]string{"__complete", "node", "stop", ""}, []string{"lab-node-1", "lab-node-2", ":4"}, []string{"etcd"}},
		{[]string{"__complete", "node", "delete", "lab-node-2"}, []string{"lab-node-2"}, []string{"lab-node-1"}},
		{[]string{"__complete", "node", "start", "lab-node-1", ""}, []string{":4"}, []string{"lab-node-2"}},
		{[]string{"__complete", "logs", ""}, []string{"etcd", "kube-apiserver", "ccm", "libvirt-cloud-controller-manager", "libvirtd", "lab-node-1", ":4"}, nil},
		{[]string{"__complete", "logs", "ku"}, []string{"kube-apiserver", "kube-scheduler"}, []string{"etcd"}},
	} {
		out, err := run(t, append([]string{"--state-dir", dir}, tt.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		lines := strings.Split(out, "\n")
		has := func(w string) bool {
			for _, l := range lines {
				if l == w {
					return true
				}
			}
			return false
		}
		for _, w := range tt.want {
			if !has(w) {
				t.Errorf("%v: no %q in\n%s", tt.args, w, out)
			}
		}
		for _, n := range tt.not {
			if has(n) {
				t.Errorf("%v: unexpected %q in\n%s", tt.args, n, out)
			}
		}
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		if out, err := run(t, "completion", shell); err != nil || !strings.Contains(out, "labcloud") {
			t.Errorf("completion %s: %v", shell, err)
		}
	}
}

func TestVersion(t *testing.T) {
	t.Setenv("LABCLOUD_TOOLS", filepath.Join(t.TempDir(), "k8s-v1.99.0-etcd-v3.6.8-containerd-v2.4.2-cni-v1.9.1"))
	out, err := run(t, "--state-dir", t.TempDir(), "version")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"labcloud unknown\n", "go go1.", "client libraries: k8s.io/client-go v0.", "lab tools (Kubernetes): v1.99.0 ("} {
		if !strings.Contains(out, w) {
			t.Errorf("version lacks %q:\n%s", w, out)
		}
	}
	if out, err := run(t, "--version"); err != nil || out != "labcloud unknown\n" {
		t.Errorf("--version = %q, %v", out, err)
	}
}
