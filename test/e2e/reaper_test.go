package e2e

import (
	"os"
	"strings"
	"testing"
)

// TestQEMUHasASubreaper: libvirt daemonizes QEMU, so a guest's QEMU is an
// orphan, and libvirt reports the guest stopped only once that process is
// reaped. The e2e libvirtd runs under tini -s, as the lab's does, so the
// failover benchmarks measure the CCM and not how late the host's PID 1
// reaps orphans (this sandbox's added 1.4 s to destroy → gratuitous ARP).
func TestQEMUHasASubreaper(t *testing.T) {
	requireEnv(t)
	const name = "e2e-reaper"
	defineDomain(t, name, true)
	pidFile := "/run/libvirt/qemu/" + name + ".pid"
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("QEMU's pid: %v", err)
	}
	qemu := strings.TrimSpace(string(data))
	status, err := procFields("/proc/" + qemu + "/status")
	if err != nil {
		t.Fatal(err)
	}
	parent := status["PPid"]
	comm, err := os.ReadFile("/proc/" + parent + "/comm")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(comm)); got != "tini" {
		t.Errorf("QEMU of %s (pid %s) has parent %s (%q), want the tini libvirtd runs under", name, qemu, parent, got)
	}
}
