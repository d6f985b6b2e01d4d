package lab

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A lab that crashed before it saved its state still leaves its other
// hosts' namespaces, and what runs in them, to down.
func TestDownWithoutStateRemovesOtherHosts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a network namespace")
	}
	dir := filepath.Join(t.TempDir(), "lab")
	h := labHosts(dir, MaxHosts)[MaxHosts-1]
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, ns := range []string{Netns, h.Netns} {
			if strings.Contains(string(out), ns) {
				t.Skipf("namespace %s exists: a lab may be up, and down would remove it", ns)
			}
		}
	}
	if out, err := exec.Command("ip", "netns", "add", h.Netns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", h.Netns).Run() })
	sleeper := exec.Command("ip", "netns", "exec", h.Netns, "sleep", "300")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- sleeper.Wait() }()
	var out bytes.Buffer
	if err := Down(dir, &out); err != nil {
		t.Logf("down: %v", err) // the machine's own libvirt may be absent
	}
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		_ = sleeper.Process.Signal(syscall.SIGKILL)
		t.Errorf("a process in %s still runs after down:\n%s", h.Netns, out.String())
	}
	if list, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(list), h.Netns) {
		t.Errorf("namespace %s left after down:\n%s", h.Netns, out.String())
	}
}
