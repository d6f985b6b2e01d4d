package systemdroot

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// needRoot skips unless we are root; as root, tools that cannot be
// installed fail the test (hack/install-deps.sh installs them in CI).
func needRoot(t *testing.T, ctx context.Context) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a systemd container: skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (mmdebstrap, systemd-nspawn, network namespaces)")
	}
	if err := InstallMissing(ctx, "mmdebstrap", "systemd-container", "iproute2"); err != nil {
		t.Fatalf("cannot install mmdebstrap/systemd-container: %v", err)
	}
}

func cachedRoot(t *testing.T, ctx context.Context) string {
	t.Helper()
	start := time.Now()
	root, err := Root(ctx, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	first := time.Since(start)
	start = time.Now()
	if again, err := Root(ctx, "", nil); err != nil || again != root {
		t.Fatalf("second Root: %q, %v; want %q", again, err, root)
	}
	t.Logf("timing: Root %v (a build if not cached yet), cached Root %v: %s", first.Round(time.Microsecond), time.Since(start).Round(time.Microsecond), root)
	return root
}

func run(t *testing.T, ctx context.Context, name string, args ...string) string {
	t.Helper()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func mustExec(t *testing.T, ctx context.Context, m *Machine, args ...string) string {
	t.Helper()
	out, err := m.Exec(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// dumpOnFailure logs the console when the test fails.
func dumpOnFailure(t *testing.T, logFile string) {
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			t.Logf("console log %s:\n%s", logFile, tail(b))
		}
	})
}

func TestMachine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	needRoot(t, ctx)
	root := cachedRoot(t, ctx)

	// A namespace of our own, with a veth pair kept entirely inside it.
	ns := fmt.Sprintf("sdrt-%d", os.Getpid())
	removeStaleNetNS(t, ctx)
	run(t, ctx, "ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	run(t, ctx, "ip", "-n", ns, "link", "add", "sdrt0", "type", "veth", "peer", "name", "sdrt1")
	run(t, ctx, "ip", "-n", ns, "addr", "add", "10.213.7.1/24", "dev", "sdrt0")
	run(t, ctx, "ip", "-n", ns, "link", "set", "sdrt0", "up")

	roDir, rwDir := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(roDir, "hello"), []byte("from host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(t.TempDir(), "console.log")
	dumpOnFailure(t, logFile)

	start := time.Now()
	m, err := Boot(ctx, Options{
		Root:         root,
		NetNS:        "/run/netns/" + ns,
		Capabilities: []string{"CAP_NET_ADMIN", "CAP_NET_RAW"},
		Binds: []Bind{
			{Source: roDir, Target: "/mnt/ro", ReadOnly: true},
			{Source: rwDir, Target: "/mnt/rw"},
		},
		LogFile: logFile,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("timing: Boot to running %v (overlay %v)", time.Since(start).Round(time.Millisecond), m.Overlay)
	t.Cleanup(func() { m.Stop() }) // a no-op after the Stop below
	pidNS := nsInode(t, m.PID())

	if got := mustExec(t, ctx, m, "cat", "/proc/1/comm"); got != "systemd" {
		t.Errorf("PID 1 is %q, want systemd", got)
	}
	if got, _ := m.Exec(ctx, "systemctl", "is-system-running"); strings.TrimSpace(got) != "running" && strings.TrimSpace(got) != "degraded" {
		t.Errorf("is-system-running: %q", got)
	}
	if got := mustExec(t, ctx, m, "ip", "-br", "addr"); !strings.Contains(got, "sdrt0") || !strings.Contains(got, "10.213.7.1/24") {
		t.Errorf("container is not in namespace %s: ip -br addr:\n%s", ns, got)
	}

	// Unit properties are enforced: a real systemd, with CAP_NET_ADMIN to give.
	status := mustExec(t, ctx, m, "systemd-run", "--wait", "--pipe", "--quiet",
		"-p", "CapabilityBoundingSet=CAP_NET_ADMIN", "-p", "NoNewPrivileges=true", "cat", "/proc/self/status")
	if !strings.Contains(status, "CapBnd:\t0000000000001000\n") {
		t.Errorf("CapBnd not exactly CAP_NET_ADMIN:\n%s", status)
	}

	// Binds.
	if got := mustExec(t, ctx, m, "cat", "/mnt/ro/hello"); got != "from host" {
		t.Errorf("read-only bind: %q", got)
	}
	if _, err := m.Exec(ctx, "touch", "/mnt/ro/nope"); err == nil {
		t.Error("read-only bind is writable")
	}
	mustExec(t, ctx, m, "sh", "-c", "echo from container > /mnt/rw/out")
	if b, err := os.ReadFile(filepath.Join(rwDir, "out")); err != nil || string(b) != "from container\n" {
		t.Errorf("read-write bind: %q, %v", b, err)
	}

	testPackage(t, ctx, m, pidNS)

	nspawn, leader, dir := m.NspawnPID(), m.PID(), m.RootDir()
	start = time.Now()
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("timing: Stop %v", time.Since(start).Round(time.Millisecond))
	for _, pid := range []int{nspawn, leader} {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil && nsInodeOK(pid) == pidNS {
			t.Errorf("process %d survived Stop", pid)
		}
	}
	if procs := procsInNS(pidNS); len(procs) > 0 {
		t.Errorf("container processes survived Stop: %q", procs)
	}
	if mps, err := MountsUnder(dir); err != nil || len(mps) > 0 {
		t.Errorf("mounts left under %s: %q %v", dir, mps, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("per-boot root %s left behind: %v", dir, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "tmp/labcloud-sdrtest.deb")); err == nil {
		t.Errorf("cached root was written to: %v", fi.Name())
	}
}

const unitName = "labcloud-sdrtest.service"

// testPackage installs a .deb with a Restart=always unit, checks that systemd
// restarts it after SIGKILL, and that purging leaves nothing behind.
func testPackage(t *testing.T, ctx context.Context, m *Machine, pidNS string) {
	deb := buildDeb(t)
	// /tmp inside is nspawn's tmpfs: this checks CopyIn sees the container's mounts.
	if err := m.CopyIn(deb, "/tmp/labcloud-sdrtest.deb"); err != nil {
		t.Fatal(err)
	}
	mustExec(t, ctx, m, "dpkg", "-i", "/tmp/labcloud-sdrtest.deb")
	mustExec(t, ctx, m, "systemctl", "start", unitName)
	if got := mustExec(t, ctx, m, "systemctl", "is-active", unitName); got != "active" {
		t.Fatalf("is-active %s: %q", unitName, got)
	}
	pid := mustExec(t, ctx, m, "systemctl", "show", "-P", "MainPID", unitName)

	mustExec(t, ctx, m, "systemctl", "kill", "-s", "KILL", unitName)
	start := time.Now()
	for {
		newPID := mustExec(t, ctx, m, "systemctl", "show", "-P", "MainPID", unitName)
		active, _ := m.Exec(ctx, "systemctl", "is-active", unitName)
		if newPID != "0" && newPID != pid && strings.TrimSpace(active) == "active" {
			break
		}
		if time.Since(start) > 15*time.Second {
			t.Fatalf("%s not restarted after SIGKILL: MainPID %s (was %s), %s", unitName, newPID, pid, active)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("timing: restart after SIGKILL %v (RestartSec=1)", time.Since(start).Round(time.Millisecond))
	if n := mustExec(t, ctx, m, "systemctl", "show", "-P", "NRestarts", unitName); n != "1" {
		t.Errorf("NRestarts = %s, want 1", n)
	}

	mustExec(t, ctx, m, "dpkg", "--purge", "labcloud-sdrtest")
	if got := mustExec(t, ctx, m, "systemctl", "show", "-P", "LoadState", unitName); got != "not-found" {
		t.Errorf("after purge LoadState = %q, want not-found", got)
	}
	for _, p := range procsInNS(pidNS) {
		if strings.HasPrefix(p, "sleep infinity") || strings.HasPrefix(p, "/bin/sleep infinity") {
			t.Errorf("process left after purge: %q", p)
		}
	}
}

// buildDeb makes a package holding a unit that runs sleep forever.
func buildDeb(t *testing.T) string {
	dir := t.TempDir()
	files := map[string]string{
		"DEBIAN/control": `Package: labcloud-sdrtest
Version: 1.0
Architecture: all
Maintainer: labcloud tests <tests@labcloud.invalid>
Description: systemdroot test package
`,
		"DEBIAN/postinst": "#!/bin/sh\nset -e\nsystemctl daemon-reload\n",
		"DEBIAN/prerm":    "#!/bin/sh\nset -e\nsystemctl stop " + unitName + " || true\n",
		"DEBIAN/postrm":   "#!/bin/sh\nset -e\nsystemctl daemon-reload || true\n",
		"lib/systemd/system/" + unitName: `[Unit]
Description=systemdroot test unit

[Service]
ExecStart=/bin/sleep infinity
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
`,
	}
	for name, body := range files {
		p := filepath.Join(dir, "pkg", name)
		mode := os.FileMode(0o644)
		if strings.HasPrefix(name, "DEBIAN/p") {
			mode = 0o755
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	deb := filepath.Join(dir, "labcloud-sdrtest.deb")
	run(t, context.Background(), "dpkg-deb", "--root-owner-group", "--build", filepath.Join(dir, "pkg"), deb)
	return deb
}

func nsInode(t *testing.T, pid int) string {
	t.Helper()
	ns := nsInodeOK(pid)
	if ns == "" {
		t.Fatalf("no PID namespace for %d", pid)
	}
	return ns
}

func nsInodeOK(pid int) string {
	ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
	return ns
}

// procsInNS lists the command lines of host processes in PID namespace ns.
func procsInNS(ns string) []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || nsInodeOK(pid) != ns {
			continue
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out = append(out, fmt.Sprintf("%s (pid %d)", strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " "), pid))
	}
	return out
}

// removeStaleNetNS deletes namespaces left by test processes that died.
func removeStaleNetNS(t *testing.T, ctx context.Context) {
	for _, f := range strings.Fields(run(t, ctx, "ip", "netns", "list")) {
		pid, ok := strings.CutPrefix(f, "sdrt-")
		if _, err := strconv.Atoi(pid); !ok || err != nil {
			continue
		}
		if _, err := os.Stat("/proc/" + pid); os.IsNotExist(err) {
			run(t, ctx, "ip", "netns", "del", f)
		}
	}
}

// TestBootCopy boots on a copy instead of an overlay, with no network
// namespace given, and checks Stop cleans it up.
func TestBootCopy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	needRoot(t, ctx)
	root := cachedRoot(t, ctx)
	logFile := filepath.Join(t.TempDir(), "console.log")
	dumpOnFailure(t, logFile)
	start := time.Now()
	m, err := Boot(ctx, Options{Root: root, Copy: true, LogFile: logFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("timing: copy + Boot to running %v", time.Since(start).Round(time.Millisecond))
	pidNS, dir := nsInode(t, m.PID()), m.RootDir()
	if m.Overlay {
		t.Error("Copy: true gave an overlay")
	}
	if got := mustExec(t, ctx, m, "ip", "-br", "link"); strings.Count(got, "\n") != 0 || !strings.HasPrefix(got, "lo") {
		t.Errorf("want a private network with only lo, got:\n%s", got)
	}
	start = time.Now()
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("timing: Stop (and delete the copy) %v", time.Since(start).Round(time.Millisecond))
	if procs := procsInNS(pidNS); len(procs) > 0 {
		t.Errorf("container processes survived Stop: %q", procs)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("copied root %s left behind: %v", dir, err)
	}
}

// inNetnsExecEnv marks the copy of this test binary that
// TestBootUnderNetnsExec runs under `ip netns exec`.
const inNetnsExecEnv = "SYSTEMDROOT_TEST_IN_NETNS_EXEC"

// TestBootUnderNetnsExec boots from a process that `ip netns exec` runs, as
// the e2e suite's tests are: it mounts a fresh sysfs on /sys, without the
// cgroup file systems that nspawn needs ("Failed to determine whether the
// unified cgroups hierarchy is used"). The copy runs TestBootCopy there.
func TestBootUnderNetnsExec(t *testing.T) {
	if os.Getenv(inNetnsExecEnv) != "" {
		t.Skip("this is the copy under ip netns exec")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	needRoot(t, ctx)
	cachedRoot(t, ctx) // built here, not in the copy's shorter view of the log
	ns := fmt.Sprintf("sdrt-%d", os.Getpid())
	removeStaleNetNS(t, ctx)
	run(t, ctx, "ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestBootCopy$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), inNetnsExecEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestBootCopy") {
		t.Fatalf("TestBootCopy under ip netns exec: %v\n%s", err, out)
	}
	t.Logf("TestBootCopy under ip netns exec:\n%s", out)
}
