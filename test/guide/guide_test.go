// Package guide runs docs/install-kubeadm.md as written, on a KVM host
// set up as Debian sets one up, with Debian guests that run kubeadm
// (make guide).
package guide

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labcloud/labcloud/test/systemdroot"
)

// guideEnv turns the guide's test on: it boots three Debian guests for
// many minutes, so only make guide (and make conformance) runs it.
const guideEnv = "LABCLOUD_GUIDE"

func needGuide(t *testing.T) {
	t.Helper()
	if os.Getenv(guideEnv) != "1" {
		t.Skipf("the guide's test runs with %s=1 (make guide)", guideEnv)
	}
	if os.Geteuid() != 0 {
		t.Fatal("make guide needs root: network namespaces, libvirtd, QEMU, systemd-nspawn")
	}
}

// tools builds (or finds) the Kubernetes binaries at v1.36.3, kubeadm too.
func tools(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("../../hack/build-tools.sh")
	cmd.Env = append(os.Environ(), "LABCLOUD_KUBEADM=true", "LABCLOUD_E2E=false")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/build-tools.sh: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// The guide's guests: names, the MACs and addresses section 1 pins.
var guests = []struct{ name, mac, ip string }{
	{"cp-1", "52:54:00:6b:00:10", "192.168.122.10"},
	{"worker-1", "52:54:00:6b:00:11", "192.168.122.11"},
	{"worker-2", "52:54:00:6b:00:12", "192.168.122.12"},
}

// hostPackages are what the guide uses on the KVM host besides systemd:
// virsh, ssh and scp, curl. libvirtd itself is the kvmHost's, its
// sockets bound into the machine where Debian's would be.
var hostPackages = []string{"libvirt-clients", "openssh-client", "curl", "ca-certificates"}

// TestGuide runs every step of docs/install-kubeadm.md in order, then
// checks from outside what they left: every Node initialized by the CCM
// with its pod-CIDR route on the host, the VIP answered to a LAN client
// on the bridge, and a pod's request to a server beyond the host.
func TestGuide(t *testing.T) {
	needGuide(t)
	ctx, cancel := context.WithTimeout(context.Background(), 75*time.Minute)
	defer cancel()
	steps, err := guideSteps(guidePath())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	img, err := buildGuestImage(ctx, "/var/cache/labcloud", tools(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("guest image ready in %s: %s", time.Since(start).Round(time.Second), img.Dir)

	h := newKVMHost(t)
	world := newWorld(t, h)
	m := bootHostMachine(t, ctx, h, img)
	repo, _ := filepath.Abs(filepath.Join("..", ".."))
	for i, s := range steps {
		start := time.Now()
		var out string
		var err error
		switch {
		case s.hook == "guests":
			err = bootGuests(ctx, h, img)
		case s.where == "build":
			out, err = runBuild(ctx, repo, s.script, m)
		default:
			out, err = m.Exec(ctx, "bash", "-euo", "pipefail", "-c", "cd /root\n"+s.script)
		}
		t.Logf("step %d (docs/install-kubeadm.md:%d) %s in %s:\n%s", i+1, s.line, s.where+s.hook, time.Since(start).Round(100*time.Millisecond), tail(out, 40))
		if err != nil {
			h.logConsoles()
			t.Fatalf("step %d (docs/install-kubeadm.md:%d) failed: %v", i+1, s.line, err)
		}
	}
	t.Logf("the guide ran in %s", time.Since(start).Round(time.Second))

	// Every Node initialized, its pod CIDR routed on the host's bridge.
	out, err := m.Exec(ctx, "kubectl", "get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name} {.spec.providerID} {.spec.podCIDR}{"\n"}{end}`)
	if err != nil {
		t.Fatal(err)
	}
	routes, err := m.Exec(ctx, "ip", "route", "show", "proto", "76", "dev", "virbr0")
	if err != nil {
		t.Fatal(err)
	}
	nodes := strings.Split(strings.TrimSpace(out), "\n")
	if len(nodes) != len(guests) {
		t.Errorf("nodes: %q, want %d", nodes, len(guests))
	}
	for _, n := range nodes {
		f := strings.Fields(n)
		if len(f) != 3 || !strings.HasPrefix(f[1], "libvirt://") || !strings.Contains(routes, f[2]+" via ") {
			t.Errorf("node %q: want a libvirt:// providerID and a route for its pod CIDR; routes:\n%s", n, routes)
		}
	}
	// The VIP from a LAN client on the bridge.
	got, err := h.lanGet(ctx, "http://192.168.122.200/hostname")
	if err != nil || !strings.HasPrefix(got, "web-") {
		t.Errorf("a LAN client on virbr0 fetching the VIP: %q, %v; want a web pod's name", got, err)
	}
	// A pod's request reached the server beyond the host.
	if world.requests.Load() == 0 {
		t.Errorf("the server beyond the host (%s) had no request from a pod", world.addr)
	}
}

// runBuild runs a build-machine block in the repository, then copies what
// it made in dist/ to the host's working directory, as the reader does.
func runBuild(ctx context.Context, repo, script string, m *systemdroot.Machine) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = repo
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), err
	}
	debs, _ := filepath.Glob(filepath.Join(repo, "dist", "*.deb"))
	if _, err := m.Exec(ctx, "mkdir", "-p", "/root/dist"); err != nil {
		return string(out), err
	}
	for _, d := range debs {
		if err := m.CopyIn(d, "/root/dist/"+filepath.Base(d)); err != nil {
			return string(out), err
		}
	}
	return string(out), nil
}

// bootHostMachine boots the KVM host's own system: Debian with systemd,
// in the kvmHost's namespace, its libvirtd's sockets where Debian's are,
// the guests' ssh key as root's, and the example kubeadm configuration in
// root's directory, where the guide's reader saved it.
func bootHostMachine(t *testing.T, ctx context.Context, h *kvmHost, img guestImage) *systemdroot.Machine {
	t.Helper()
	if err := systemdroot.InstallMissing(ctx, "mmdebstrap", "systemd-container"); err != nil {
		t.Fatal(err)
	}
	root, err := systemdroot.Root(ctx, systemdroot.DefaultCacheDir, hostPackages)
	if err != nil {
		t.Fatal(err)
	}
	m, err := systemdroot.Boot(ctx, systemdroot.Options{
		Root:         root,
		NetNS:        "/run/netns/" + h.ns,
		Binds:        []systemdroot.Bind{{Source: filepath.Join(h.lv.Root, "run"), Target: "/run/libvirt"}},
		Capabilities: []string{"CAP_NET_ADMIN", "CAP_NET_RAW"},
		LogFile:      filepath.Join(h.dir, "host-console.log"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Stop(); err != nil {
			t.Errorf("stop the host's systemd: %v", err)
		}
	})
	sshConfig := filepath.Join(h.dir, "ssh_config")
	// The reader has answered ssh's question about each guest's host key.
	if err := os.WriteFile(sshConfig, []byte("StrictHostKeyChecking accept-new\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Exec(ctx, "install", "-d", "-m", "0700", "/root/.ssh"); err != nil {
		t.Fatal(err)
	}
	for src, dst := range map[string]string{
		img.Key:   "/root/.ssh/id_ed25519",
		sshConfig: "/root/.ssh/config",
		filepath.Join("..", "..", "examples", "kubeadm-config.yaml"): "/root/kubeadm-config.yaml",
	} {
		if err := m.CopyIn(src, dst); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// bootGuests starts the three guests with the MACs section 1 pinned, and
// waits until each has its pinned address and answers ssh.
func bootGuests(ctx context.Context, h *kvmHost, img guestImage) error {
	for i, g := range guests {
		if err := h.boot(g.name, g.mac, i == 0, img); err != nil {
			return err
		}
	}
	for _, g := range guests {
		ip, err := h.lease(ctx, g.mac)
		if err != nil {
			return err
		}
		if ip != g.ip {
			return fmt.Errorf("%s got %s, want the pinned %s", g.name, ip, g.ip)
		}
		if err := h.waitSSH(ctx, img, ip); err != nil {
			return fmt.Errorf("%s: %w", g.name, err)
		}
	}
	return nil
}

// world is what lies beyond the KVM host: its default route, and an HTTP
// server there, in the test's own namespace (never off the machine).
type world struct {
	addr     string
	requests atomic.Int64
}

func newWorld(t *testing.T, h *kvmHost) *world {
	t.Helper()
	w := &world{addr: "10.255.124.1"}
	outside, inside := fmt.Sprintf("lcgw%d", os.Getpid()%100000), "uplink0"
	for _, args := range [][]string{
		{"link", "add", outside, "type", "veth", "peer", "name", inside, "netns", h.ns},
		{"addr", "add", w.addr + "/30", "dev", outside},
		{"link", "set", outside, "up"},
		{"-n", h.ns, "addr", "add", "10.255.124.2/30", "dev", inside},
		{"-n", h.ns, "link", "set", inside, "up"},
		{"-n", h.ns, "route", "add", "default", "via", w.addr},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", outside).Run() })
	ln, err := net.Listen("tcp", net.JoinHostPort(w.addr, "80"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		w.requests.Add(1)
		io.WriteString(rw, "the router's page\n")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return w
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
