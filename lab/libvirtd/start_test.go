package libvirtd

import (
	"os/exec"
	"testing"
	"time"
)

// A libvirtd still exiting holds its drivers' pid files, and one started
// beside it exits at once (CI saw "libvirtd did not start" with an empty
// log right after another lab's down): start waits for it to end.
func TestWaitExitedWaitsForTheOldDaemon(t *testing.T) {
	const program = "labcloud-test-daemon"
	old := exec.Command("bash", "-c", "exec -a "+program+" sleep 1")
	if err := old.Start(); err != nil {
		t.Fatal(err)
	}
	go old.Wait() //nolint:errcheck // reaped, so it does not linger as a zombie
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	waitExited(program, 10*time.Second)
	if waited := time.Since(start); waited < 500*time.Millisecond || waited > 5*time.Second {
		t.Errorf("waitExited returned after %s; the old daemon ran for about 0.9 s more", waited)
	}
	start = time.Now()
	waitExited(program, 10*time.Second)
	if waited := time.Since(start); waited > time.Second {
		t.Errorf("waitExited waited %s with no such process", waited)
	}
}
