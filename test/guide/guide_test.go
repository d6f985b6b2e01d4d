// Package guide runs docs/install-kubeadm.md as written, on a KVM host
// set up as Debian sets one up, with Debian guests that run kubeadm
// (make guide).
package guide

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// guideEnv turns the guide's tests on: they boot Debian guests for many
// minutes, so only make guide (and make conformance) runs them.
const guideEnv = "LABCLOUD_GUIDE"

func needGuide(t *testing.T) {
	t.Helper()
	if os.Getenv(guideEnv) != "1" {
		t.Skipf("the guide's test runs with %s=1 (make guide)", guideEnv)
	}
	if os.Geteuid() != 0 {
		t.Fatal("make guide needs root: network namespaces, libvirtd, QEMU")
	}
}

// tools builds (or finds) the Kubernetes binaries at v1.36.3, kubeadm too.
func tools(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("../../hack/build-tools.sh")
	cmd.Env = append(os.Environ(), "LABCLOUD_KUBEADM=true", "LABCLOUD_E2E=false")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/build-tools.sh: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// A Debian guest of the guide's image boots on the stock default network,
// gets a lease, and runs containerd and kubeadm v1.36.3.
func TestGuestBoots(t *testing.T) {
	needGuide(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	img, err := buildGuestImage(ctx, "/var/cache/labcloud", tools(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("guest image in %s: %s", time.Since(start).Round(time.Second), img.Dir)
	h := newKVMHost(t)
	const mac = "52:54:00:6b:00:10"
	start = time.Now()
	if err := h.boot("cp-1", mac, img); err != nil {
		t.Fatal(err)
	}
	ip, err := h.lease(ctx, mac)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.waitSSH(ctx, img, ip); err != nil {
		con, _ := os.ReadFile(h.console("cp-1"))
		t.Fatalf("%v\nconsole:\n%s", err, tail(string(con), 60))
	}
	t.Logf("cp-1 at %s answers ssh %s after start", ip, time.Since(start).Round(time.Second))
	out, err := h.ssh(ctx, img, ip, "kubeadm version -o short; systemctl is-active containerd; hostname")
	if err != nil || !strings.Contains(out, "v1.36.3") || !strings.Contains(out, "active") || !strings.Contains(out, "cp-1") {
		t.Fatalf("on cp-1: %v\n%s", err, out)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
