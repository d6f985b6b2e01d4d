package libvirtd

import (
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Stopping the lock holder's recorded process must release the lock: a
// holder that left a child with the lock behind blocked every later lab and
// e2e run on the host.
func TestHoldLockReleasedWhenStopped(t *testing.T) {
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("flock (util-linux) not installed")
	}
	dir := t.TempDir()
	lock := filepath.Join(dir, "lock")
	p, err := holdLock(lock, dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("flock", "--nonblock", lock, "true").Run(); err == nil {
		t.Fatal("the lock is free while the holder runs")
	}
	// As labcloud down does: the recorded pid alone, not its process group.
	if err := syscall.Kill(p.Pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	deadline := time.Now().Add(5 * time.Second)
	for exec.Command("flock", "--nonblock", lock, "true").Run() != nil {
		if time.Now().After(deadline) {
			t.Fatal("the lock is still held 5 s after the holder was stopped")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
