package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/labcloud/labcloud/examples"
	"github.com/labcloud/labcloud/internal/e2etest"
	"github.com/labcloud/labcloud/internal/frr"
	"github.com/labcloud/labcloud/test/systemdroot"
)

// maxExposure bounds `systemd-analyze security`'s score of the installed
// unit: 4.1 before issue 40's hardening, 2.2 after. What is left is what
// the CCM's work needs: root with CAP_NET_ADMIN and CAP_NET_RAW, the host's
// network, and packet, netlink, Unix and IP sockets.
const maxExposure = 2.2

// unitWatchdog replaces the unit's WatchdogSec (60 s) in this test, so that
// a CCM that could not reach systemd's notify socket from inside its
// sandbox would be killed while the test watches.
const unitWatchdog = 10 * time.Second

// The Debian package under a real systemd, with every part of the unit's
// sandbox applied by systemd itself (the system-call filter, W^X memory,
// /proc hidden, the umask; the other tests apply only what setpriv can:
// capabilities and no new privileges): in a Debian root booted with
// systemd as PID 1, joined to the suite's network namespace with libvirt's
// sockets bound in, dpkg installs the package and systemd starts the unit.
// The CCM then does everything its sandbox must allow: libvirt through
// cgo (a Node initialized), netlink (its pod-CIDR route), packet sockets
// (its VIP answered by ARP), BGP with TCP MD5 and BFD (the route at FRR),
// a second hypervisor host over ssh (qemu+ssh://, with the key and known_hosts
// in the unit's directory; without the known_hosts the CCM does not start
// and names it), the watchdog fed through the notify socket. The test reports the unit's
// exposure score, the CCM's peak memory and threads against MemoryMax and
// TasksMax, and purges the package.
func TestDebUnderSystemd(t *testing.T) {
	requireEnv(t)
	const password = "e2e-systemd-secret"
	router := startRouter(t, password)
	requireUnitPort(t)
	ctx := context.Background()
	tmp := t.TempDir()
	deb := e2etest.MakeDeb(t, tmp)
	kvm2 := startSSHHost(t)
	if _, _, err := kvm2.GrantSSH(tmp, sshHostAddr, ""); err != nil { // tmp/id_ed25519, tmp/known_hosts
		t.Fatal(err)
	}
	sshKey, sshKnown := examples.ConfigDir+"/id_ed25519", examples.ConfigDir+"/known_hosts"

	root, err := systemdroot.Root(ctx, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := systemdroot.Boot(ctx, systemdroot.Options{
		Root:         root,
		NetNS:        "/run/netns/" + os.Getenv(netnsEnv),
		Capabilities: []string{"CAP_NET_ADMIN", "CAP_NET_RAW"},
		Binds: []systemdroot.Bind{
			{Source: "/run/libvirt", ReadOnly: true},
			{Source: filepath.Dir(deb), Target: "/mnt/deb", ReadOnly: true},
		},
		LogFile: filepath.Join(tmp, "console.log"),
	})
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := m.Exec(ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(out)
	}
	journal := func() string {
		out, _ := m.Exec(ctx, "journalctl", "-u", debPackage, "--no-pager", "-o", "cat")
		return out
	}
	// Last registered, first run: the Services and Nodes below are deleted
	// while the CCM still runs; then the purge withdraws its routes and
	// neighbour entries from the suite's namespace, as on a host.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the unit's journal:\n%s", lastLines(journal(), 60))
		}
		if out, err := m.Exec(ctx, "dpkg", "--purge", debPackage); err != nil {
			t.Errorf("dpkg --purge: %v\n%s", err, out)
		}
		if err := m.Stop(); err != nil {
			t.Errorf("stop the systemd machine: %v", err)
		}
		err := env.admin.CoordinationV1().Leases("kube-system").Delete(context.Background(), leaseName, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete the leader lease: %v", err)
		}
	})

	run("dpkg", "-i", "/mnt/deb/"+filepath.Base(deb))
	if got := run("stat", "-c", "%a %U:%G", examples.ConfigDir); got != "750 root:root" {
		t.Errorf("dpkg made %s %s, want 750 root:root", examples.ConfigDir, got)
	}
	// The files an administrator writes, each 0600, and a drop-in.
	pwFile := examples.ConfigDir + "/bgp-password"
	dropIn := "/etc/systemd/system/" + debPackage + ".service.d/watchdog.conf"
	files := map[string]string{
		examples.UnitCloudConfig: withSSHHost(t, lbCloudConfig("10.88.0.40-10.88.0.45"), sshKey, sshKnown) + fmt.Sprintf(`routes:
  bridge: %s
bgp:
  asn: 64513
  routerID: %s
  peers:
    - {address: %s, asn: 64512, bfd: true, passwordFile: %s}
`, env.bridge, e2eCCMAddr, e2eRouterAddr, pwFile),
		pwFile: password + "\n",
		dropIn: fmt.Sprintf("[Service]\nWatchdogSec=%s\n", unitWatchdog),
	}
	for dst, body := range files {
		if err := os.WriteFile(filepath.Join(tmp, filepath.Base(dst)), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.cp.WriteKubeconfig(filepath.Join(tmp, "kubeconfig"), "cloud-controller-manager", serviceAccountToken(t)); err != nil {
		t.Fatal(err)
	}
	run("mkdir", "-p", filepath.Dir(dropIn))
	copyIn := func(dsts ...string) {
		t.Helper()
		for _, dst := range dsts {
			if err := m.CopyIn(filepath.Join(tmp, filepath.Base(dst)), dst); err != nil {
				t.Fatal(err)
			}
		}
	}
	copyIn(examples.UnitCloudConfig, pwFile, examples.UnitKubeconfig, dropIn, sshKey)
	run("systemctl", "daemon-reload")

	// Without the known_hosts the second host's URI names, the CCM does
	// not start, and says which file.
	run("systemctl", "start", debPackage)
	noKnownHosts := "known_hosts " + sshKnown + ": open " + sshKnown + ": no such file or directory"
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return strings.Contains(journal(), noKnownHosts), nil
	})
	if err != nil {
		t.Fatalf("without %s, the journal does not say %q:\n%s", sshKnown, noKnownHosts, lastLines(journal(), 20))
	}
	t.Logf("without its known_hosts the unit's CCM does not start: %s", strings.TrimSpace(grepLines(journal(), noKnownHosts)))
	run("systemctl", "stop", debPackage)
	_, _ = m.Exec(ctx, "systemctl", "reset-failed", debPackage) // NRestarts back to 0
	copyIn(sshKnown)

	started := time.Now()
	run("systemctl", "start", debPackage)

	base := fmt.Sprintf("https://127.0.0.1:%d", defaultSecurePort)
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(context.Context) (bool, error) {
		code, body, err := get(base+"/healthz", "")
		return err == nil && code == http.StatusOK && body == "ok", nil
	})
	if err != nil {
		t.Fatalf("the unit's CCM serves no healthy /healthz within 90 s; journal's errors:\n%s\nlast lines:\n%s", klogErrors(journal()), lastLines(journal(), 40))
	}
	t.Logf("the unit's CCM serves /healthz ok %s after systemctl start", time.Since(started).Round(time.Millisecond))
	hostname := run("hostname")
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := env.admin.CoordinationV1().Leases("kube-system").Get(ctx, leaseName, metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && strings.HasPrefix(*l.Spec.HolderIdentity, hostname+"_"), nil
	})
	if err != nil {
		t.Fatalf("the unit's CCM did not become leader; journal:\n%s", lastLines(journal(), 40))
	}

	// libvirt (cgo): a Node of a domain is initialized; netlink: its pod
	// CIDR is routed; BGP: the router learns it.
	uuid, mac := defineDomain(t, "e2e-sd", true)
	lease := waitLease(t, mac)
	createNode(t, "e2e-sd", v1.ConditionTrue)
	n := waitNode(t, "e2e-sd", "initialization, an address and a pod CIDR", 60*time.Second, func(n *v1.Node) bool {
		return n != nil && n.Spec.ProviderID == "libvirt://"+uuid && internalIP(n) == lease && n.Spec.PodCIDR != ""
	})
	waitRoutes(t, "the Node's pod CIDR routed via its address", 30*time.Second, func(r map[string]string) bool { return r[n.Spec.PodCIDR] == lease })
	waitRIB(t, router, "the Node's pod CIDR at the router", 60*time.Second, func(rib map[netip.Prefix]frr.Route) bool {
		r, ok := rib[netip.MustParsePrefix(n.Spec.PodCIDR)]
		return ok && r.Selected && slices.Contains(r.NextHops, netip.MustParseAddr(lease))
	})

	// Packet sockets: a LAN client's ARP request for the VIP is answered
	// with the node's MAC.
	client := newLANClient(t, "10.88.0.6/24")
	createLBService(t, "e2e-sd-lb", nil, 80)
	vip, _ := waitVIP(t, "e2e-sd-lb", 60*time.Second)
	nodeMAC, _ := net.ParseMAC(mac)
	client.waitARP(t, vip, nodeMAC, 30*time.Second)
	t.Logf("under systemd: Node %s initialized, pod CIDR %s routed and at the router via %s, VIP %s answered by %s",
		n.Name, n.Spec.PodCIDR, lease, vip, nodeMAC)

	// The second host over ssh, from inside the sandbox: its domain is
	// cached.
	cached := fmt.Sprintf("\nlabcloud_libvirt_cached_domains{zone=%q} 1\n", sshHostZone)
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		_, body, err := get(base+"/metrics", adminToken(t))
		return err == nil && strings.Contains(body, cached), nil
	})
	if err != nil {
		t.Errorf("/metrics lacks %q: the CCM did not read %s's domains over ssh; journal:\n%s", strings.TrimSpace(cached), sshHostZone, grepLines(journal(), sshHostAddr))
	} else {
		t.Logf("under systemd: %s's domain cached over ssh (qemu+ssh://, key and known_hosts in %s)", sshHostZone, examples.ConfigDir)
	}

	// process_start_time_seconds reads /proc/stat, which ProcSubset=pid
	// would hide.
	code, body, err := get(base+"/metrics", adminToken(t))
	if err != nil || code != http.StatusOK || !strings.Contains(body, "labcloud_") || !strings.Contains(body, "\nprocess_start_time_seconds ") {
		t.Errorf("/metrics: %d, %v, want labcloud_ metrics and process_start_time_seconds (%.200s)", code, err, body)
	}

	// The kernel applies the sandbox to the CCM's process.
	pid := run("systemctl", "show", "-P", "MainPID", debPackage)
	status := run("cat", "/proc/"+pid+"/status")
	for _, want := range []string{"CapBnd:\t0000000000003000", "NoNewPrivs:\t1", "Seccomp:\t2", "Umask:\t0077"} {
		if !strings.Contains(status, want+"\n") {
			t.Errorf("the CCM's /proc/%s/status lacks %q:\n%s", pid, want, status)
		}
	}
	if mounts := run("cat", "/proc/"+pid+"/mountinfo"); !regexp.MustCompile(` /proc .* proc proc \S*hidepid=invisible`).MatchString(mounts) {
		t.Errorf("the CCM's /proc is not mounted hidepid=invisible:\n%s", grepLines(mounts, " /proc "))
	}

	// Its peaks so far against the unit's bounds.
	limits := run("systemctl", "show", "--value", "-p", "MemoryMax", "-p", "TasksMax", debPackage)
	memMax, tasksMax := parseLimits(t, limits)
	hwm, threads := statusField(t, status, "VmHWM"), statusField(t, status, "Threads")
	t.Logf("the CCM's peak RSS %.1f MiB (MemoryMax %.0f MiB), %d threads (TasksMax %d)", float64(hwm)/1024, float64(memMax)/(1<<20), threads, tasksMax)
	if hwm*1024*4 > memMax || threads*4 > tasksMax {
		t.Errorf("the CCM already uses a quarter of MemoryMax or TasksMax with one Node and one Service: %d KiB of %d bytes, %d of %d tasks", hwm, memMax, threads, tasksMax)
	}

	// The watchdog is fed: over three periods systemd killed nothing.
	if d := 3*unitWatchdog - time.Since(started); d > 0 {
		time.Sleep(d)
	}
	if got := run("systemctl", "show", "-P", "NRestarts", debPackage); got != "0" {
		t.Errorf("systemd restarted the CCM %s times; journal:\n%s", got, lastLines(journal(), 40))
	}
	if got := run("systemctl", "show", "-P", "MainPID", debPackage); got != pid {
		t.Errorf("the CCM's MainPID went from %s to %s", pid, got)
	}
	// A system call the filter refuses fails with EPERM: nothing may say so.
	if bad := grepLines(strings.ToLower(journal()), "not permitted"); bad != "" {
		t.Errorf("the CCM was refused something:\n%s", bad)
	}

	out, _ := m.Exec(ctx, "systemd-analyze", "security", "--no-pager", debPackage)
	score := regexp.MustCompile(`Overall exposure level for \S+: (\d+\.\d+)`).FindStringSubmatch(out)
	if score == nil {
		t.Fatalf("systemd-analyze security: no overall exposure in:\n%s", out)
	}
	t.Logf("systemd-analyze security %s: exposure %s (at most %.1f)", debPackage, score[1], maxExposure)
	if v, _ := strconv.ParseFloat(score[1], 64); v > maxExposure {
		t.Errorf("exposure %s > %.1f:\n%s", score[1], maxExposure, grepLines(out, "✗"))
	}
}

// parseLimits reads `systemctl show --value -p MemoryMax -p TasksMax`:
// bytes, tasks.
func parseLimits(t *testing.T, out string) (mem, tasks int64) {
	t.Helper()
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("MemoryMax and TasksMax: %q", out)
	}
	mem, err1 := strconv.ParseInt(f[0], 10, 64)
	tasks, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("the unit sets no MemoryMax or TasksMax: %q", out)
	}
	return mem, tasks
}

// statusField is a number of /proc/PID/status ("VmHWM:  1234 kB" gives 1234).
func statusField(t *testing.T, status, name string) int64 {
	t.Helper()
	for _, line := range strings.Split(status, "\n") {
		if rest, ok := strings.CutPrefix(line, name+":"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				if v, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					return v
				}
			}
		}
	}
	t.Fatalf("no %s in /proc/PID/status", name)
	return 0
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// klogErrors are the error lines of a klog log (E, then the date).
func klogErrors(log string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if len(l) > 1 && l[0] == 'E' && l[1] >= '0' && l[1] <= '9' {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
