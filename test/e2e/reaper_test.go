package e2e

import (
	"os"
	"strconv"
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
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("QEMU's pid file: %v", err)
	}
	parent, comm, err := parentOf(pid)
	if err != nil {
		t.Fatal(err)
	}
	if comm != "tini" {
		t.Errorf("QEMU of %s (pid %d) has parent %d (%q), want the tini libvirtd runs under", name, pid, parent, comm)
	}
}
