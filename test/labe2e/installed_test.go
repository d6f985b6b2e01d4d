package labe2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/labcloud/labcloud/internal/e2etest"
	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/lanprobe"
	"github.com/labcloud/labcloud/test/systemdroot"
)

const unitName = "libvirt-cloud-controller-manager"

// checkInstalled replaces the lab's CCM with the Debian package installed
// as a user installs it: in a Debian root booted with systemd as PID 1,
// joined to the lab's network namespace with libvirt's sockets bound in;
// the kubeconfig made by docs/install-kubeadm.md's commands, the lab's
// cloud config, `systemctl enable --now`. Then, from a LAN client on the
// bridge: the VIP is answered (ARP, HTTP) under the unit's own sandbox, a
// restart loses no HTTP answer, a SIGKILL is restarted by systemd, and a
// purge leaves no owned route, neighbour entry or process. The installed
// CCM keeps serving the lab until the returned function purges it (the
// lab's later checks run against it) and stops the machine.
func checkInstalled(t *testing.T, l *labcloud, vip string, pods map[string]string) (purge func()) {
	ctx := context.Background()
	st, err := lab.LoadState(l.dir)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	deb := e2etest.MakeDeb(t, dir)
	if err := systemdroot.InstallMissing(ctx, "mmdebstrap", "systemd-container"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	root, err := systemdroot.Root(ctx, systemdroot.DefaultCacheDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := systemdroot.Boot(ctx, systemdroot.Options{
		Root:  root,
		NetNS: "/run/netns/" + lab.Netns,
		Binds: []systemdroot.Bind{
			{Source: "/run/libvirt", ReadOnly: true},
			{Source: filepath.Dir(deb), Target: "/mnt/deb", ReadOnly: true},
			{Source: st.Tools, Target: "/mnt/tools", ReadOnly: true},
			{Source: filepath.Dir(st.Kubeconfig), Target: "/mnt/lab", ReadOnly: true},
		},
		Capabilities: []string{"CAP_NET_ADMIN", "CAP_NET_RAW"},
		LogFile:      filepath.Join(dir, "console.log"),
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := func() {
		if err := m.Stop(); err != nil {
			t.Errorf("stop the systemd machine: %v", err)
		}
	}
	defer func() {
		if purge == nil {
			stop()
		}
	}()
	t.Logf("systemd machine %s up in the lab's namespace %s after start", m.Name, time.Since(start).Round(time.Millisecond))
	run := func(args ...string) string {
		t.Helper()
		out, err := m.Exec(ctx, args...)
		if err != nil {
			t.Fatalf("in the machine: %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}

	run("dpkg", "-i", "/mnt/deb/"+filepath.Base(deb))
	// The kubeconfig as docs/install-kubeadm.md makes it, with the lab's
	// admin kubeconfig and kubectl.
	script := docsBlock(t, "## 5. RBAC and a kubeconfig")
	run("env", "PATH=/mnt/tools:/usr/sbin:/usr/bin:/sbin:/bin", "KUBECONFIG=/mnt/lab/"+filepath.Base(st.Kubeconfig), "bash", "-euo", "pipefail", "-c", script)
	if err := m.CopyIn(filepath.Join(st.Dir, "cloud-config.yaml"), "/etc/libvirt-cloud-controller-manager/cloud-config.yaml"); err != nil {
		t.Fatal(err)
	}

	// The lab's CCM gives way; what it wrote stays, as after a restart.
	if err := killPid(st.Pids["libvirt-cloud-controller-manager"]); err != nil {
		t.Fatalf("stop the lab's CCM: %v", err)
	}
	client := newLANClient(t)
	holder := lease(l)
	hostname := strings.TrimSpace(run("hostname"))
	run("systemctl", "enable", "--now", unitName)
	eventually(t, "the installed CCM leads", 90*time.Second, time.Second, func() string {
		// Upstream's identity is the hostname and a fresh UUID.
		if h := lease(l); h == holder || !strings.HasPrefix(h, hostname+"_") {
			return fmt.Sprintf("lease held by %q (before: %q); unit:\n%s", h, holder, tail(journal(m), 1500))
		}
		return ""
	})
	mac := waitARP(t, client, vip, 60*time.Second)
	got := client.Hostname(vip, 3*time.Second)
	if _, ok := pods[got]; !ok {
		t.Fatalf("HTTP to %s from the LAN client: %q, want a web pod's name", vip, got)
	}
	t.Logf("installed CCM under systemd: VIP %s answered by %s (ARP), by pod %s (HTTP)", vip, mac, got)
	if out, err := exec.Command("ip", "netns", "exec", lab.Netns, "curl", "-sk", "https://127.0.0.1:10258/healthz?verbose").CombinedOutput(); err != nil || !strings.Contains(string(out), "[+]libvirt-data-path ok") {
		t.Errorf("/healthz of the installed CCM: %v\n%s", err, out)
	}

	// The unit's sandbox is what the CCM runs in.
	show := run("systemctl", "show", unitName, "-p", "MainPID", "-p", "CapabilityBoundingSet", "-p", "NoNewPrivileges", "-p", "ProtectSystem", "-p", "WatchdogUSec")
	for _, want := range []string{"CapabilityBoundingSet=cap_net_admin cap_net_raw", "NoNewPrivileges=yes", "ProtectSystem=strict", "WatchdogUSec=1min"} {
		if !strings.Contains(show, want) {
			t.Errorf("systemctl show: want %s in:\n%s", want, show)
		}
	}
	status := run("sh", "-c", "grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/$(systemctl show -P MainPID "+unitName+")/status")
	if !strings.Contains(status, "CapBnd:\t0000000000003000") || !strings.Contains(status, "NoNewPrivs:\t1") {
		t.Errorf("the CCM's process runs with:\n%s\nwant CAP_NET_ADMIN and CAP_NET_RAW only, no new privileges", status)
	}
	security, _ := m.Exec(ctx, "systemd-analyze", "security", "--no-pager", unitName)
	t.Logf("systemd-analyze security %s:\n%s", unitName, security)

	// A restart loses no answer: clients keep their entries, the new
	// process stands in from the host's record until it leads.
	probe := startProbe(client, vip)
	run("systemctl", "restart", unitName)
	waitARP(t, client, vip, 30*time.Second)
	time.Sleep(3 * time.Second)
	r := probe()
	t.Logf("systemctl restart: %s", r)
	if r.httpFailed > 0 {
		t.Errorf("systemctl restart lost %d of %d HTTP answers", r.httpFailed, r.http)
	}

	// A SIGKILL: systemd starts it again; answers resume after its RestartSec.
	pid := run("systemctl", "show", "-P", "MainPID", unitName)
	probe = startProbe(client, vip)
	killed := time.Now()
	run("systemctl", "kill", "-s", "KILL", unitName)
	eventually(t, "systemd restarts the killed CCM", 60*time.Second, 200*time.Millisecond, func() string {
		if now := strings.TrimSpace(run("systemctl", "show", "-P", "MainPID", unitName)); now == "0" || now == strings.TrimSpace(pid) {
			return "MainPID " + now
		}
		return ""
	})
	waitARP(t, client, vip, 30*time.Second)
	r = probe()
	t.Logf("systemctl kill -s KILL: answered again by ARP %.1fs after the kill; %s", time.Since(killed).Seconds(), r)
	if r.httpFailed > 0 {
		t.Errorf("a SIGKILL of the CCM lost %d of %d HTTP answers", r.httpFailed, r.http)
	}

	return func() {
		defer stop()
		checkPurge(t, m, vip)
	}
}

// checkPurge purges the package: nothing of the CCM stays on the host.
func checkPurge(t *testing.T, m *systemdroot.Machine, vip string) {
	if out, err := m.Exec(context.Background(), "dpkg", "--purge", unitName); err != nil {
		t.Fatalf("dpkg --purge: %v\n%s", err, out)
	}
	if out, err := m.Exec(context.Background(), "pgrep", "-f", "/usr/bin/"+unitName); err == nil {
		t.Errorf("a CCM process outlives the purge: %s", out)
	}
	for _, args := range [][]string{{"route", "show", "proto", "76"}, {"route", "show", "proto", "77"}} {
		if out := inLab(t, append([]string{"ip"}, args...)...); strings.TrimSpace(out) != "" {
			t.Errorf("after the purge, ip %s:\n%s", strings.Join(args, " "), out)
		}
	}
	neigh := inLab(t, "ip", "neigh", "show", "dev", lab.Bridge, "nud", "permanent")
	if strings.Contains(neigh, vip+" ") {
		t.Errorf("after the purge the VIP's neighbour entry stays:\n%s", neigh)
	}
}

// docsBlock is the first ```sh block after heading in docs/install-kubeadm.md.
func docsBlock(t *testing.T, heading string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(e2etest.RepoRoot(), "docs", "install-kubeadm.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), heading)
	_, block, ok2 := strings.Cut(section, "```sh\n")
	script, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatalf("docs/install-kubeadm.md has no sh block after %q", heading)
	}
	return script
}

func journal(m *systemdroot.Machine) string {
	status, _ := m.Exec(context.Background(), "systemctl", "status", "--no-pager", "-l", "-n", "30", unitName)
	return status
}

func lease(l *labcloud) string {
	out, _ := l.kubectl(30*time.Second, "-n", "kube-system", "get", "lease", "cloud-controller-manager", "-o", "jsonpath={.spec.holderIdentity}")
	return strings.TrimSpace(out)
}

func killPid(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("no pid")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	for i := 0; i < 100 && syscall.Kill(pid, 0) == nil; i++ {
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

func inLab(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", lab.Netns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// newLANClient plugs a machine into the lab's bridge (lanprobe), at .252
// of the lab's network, until the test ends: it asks for VIPs as any
// machine on the LAN does.
func newLANClient(t *testing.T) *lanprobe.Client {
	t.Helper()
	c, err := lanprobe.New(lanprobe.Options{Bridge: lab.Bridge, BridgeNetns: lab.Netns, Port: fmt.Sprintf("lclan%d", os.Getpid()%100000),
		Addr: netip.MustParsePrefix("10.123.0.252/24"), Netns: fmt.Sprintf("lc-lan-%d", os.Getpid())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// resolve sends one ARP request for ip from c and returns the MAC that
// answers within timeout, an error when none does.
func resolve(c *lanprobe.Client, ip string, timeout time.Duration) (net.HardwareAddr, error) {
	mac, err := c.Resolve(netip.MustParseAddr(ip), timeout)
	if err == nil && mac == nil {
		err = fmt.Errorf("no ARP answer for %s within %s", ip, timeout)
	}
	return mac, err
}

func waitARP(t *testing.T, c *lanprobe.Client, ip string, timeout time.Duration) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	eventually(t, "ARP answer for "+ip+" on the LAN", timeout, 200*time.Millisecond, func() string {
		var err error
		if mac, err = resolve(c, ip, 500*time.Millisecond); err != nil {
			return err.Error()
		}
		return ""
	})
	return mac
}

type probeResult struct {
	http, httpFailed, arpAsked, arpMissed int
}

func (r probeResult) String() string {
	return fmt.Sprintf("%d/%d HTTP requests failed, %d/%d ARP requests unanswered", r.httpFailed, r.http, r.arpMissed, r.arpAsked)
}

// startProbe asks for ip over HTTP (a new connection each 200 ms) and ARP
// until the returned function is called, which says how many failed.
func startProbe(c *lanprobe.Client, ip string) func() probeResult {
	var (
		mu   sync.Mutex
		r    probeResult
		wg   sync.WaitGroup
		done = make(chan struct{})
	)
	loop := func(f func()) {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(200 * time.Millisecond):
			}
			f()
		}
	}
	wg.Add(2)
	go loop(func() {
		answered := c.Hostname(ip, 2*time.Second) != ""
		mu.Lock()
		r.http++
		if !answered {
			r.httpFailed++
		}
		mu.Unlock()
	})
	go loop(func() {
		_, err := resolve(c, ip, 500*time.Millisecond)
		mu.Lock()
		r.arpAsked++
		if err != nil {
			r.arpMissed++
		}
		mu.Unlock()
	})
	return func() probeResult {
		close(done)
		wg.Wait()
		return r
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
