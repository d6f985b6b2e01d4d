package host

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestStarted: this test's own process started before now (give or take
// the boot time's whole second) and within the hour.
func TestStarted(t *testing.T) {
	started, err := Started(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if started.After(time.Now().Add(time.Second)) || time.Since(started) > time.Hour {
		t.Errorf("this process started at %s?", started)
	}
}

// TestProcessWithCommandThenKill finds a child by its exact command line,
// and KillAndWait leaves it gone.
func TestProcessWithCommandThenKill(t *testing.T) {
	cmd := exec.Command("sleep", "3141")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	defer cmd.Process.Kill()
	var pid int
	for i := 0; i < 50 && pid == 0; i++ {
		pid = ProcessWithCommand([]string{"sleep", "3141"})
		time.Sleep(10 * time.Millisecond)
	}
	if pid != cmd.Process.Pid {
		t.Fatalf("ProcessWithCommand = %d, want the child %d", pid, cmd.Process.Pid)
	}
	if !IsProcess(pid, "sleep") || IsProcess(pid, "qemu") {
		t.Errorf("IsProcess(%d) does not tell sleep from qemu", pid)
	}
	if err := KillAndWait(pid, syscall.SIGTERM, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	<-done
	if ProcessWithCommand([]string{"sleep", "3141"}) != 0 {
		t.Error("the child is still listed after KillAndWait")
	}
}

func TestNetworkMAC(t *testing.T) {
	const twoNICs = `<domain type='kvm'><name>n1</name><devices>
  <interface type='network'><mac address='52:54:00:AA:00:01'/><source network='default'/></interface>
  <interface type='network'><mac address='52:54:00:7C:00:01'/><source network='labcloud'/></interface>
</devices></domain>`
	for _, tc := range []struct{ xml, network, want string }{
		{twoNICs, "labcloud", "52:54:00:7c:00:01"},
		{twoNICs, "default", "52:54:00:aa:00:01"},
		{twoNICs, "other", ""},
		{`<domain><name>n2</name></domain>`, "labcloud", ""},
		{`not xml`, "labcloud", ""},
	} {
		if got := NetworkMAC(tc.xml, tc.network); got != tc.want {
			t.Errorf("NetworkMAC(%.30q, %s) = %q, want %q", tc.xml, tc.network, got, tc.want)
		}
	}
}

// QEMUs finds guests by the command line libvirt gives QEMU, by exact
// name: lab-node-1 is not lab-node-10.
func TestQEMUs(t *testing.T) {
	prefix := fmt.Sprintf("lctestq%d-", os.Getpid())
	var cmds []*exec.Cmd
	for _, name := range []string{prefix + "1", prefix + "10"} {
		// sh's own command line carries the arguments after the script;
		// read, a builtin, waits without a child (a forked child has its
		// parent's command line until it execs).
		c := exec.Command("sh", "-c", "read x", "qemu-system-x86_64", "-name", "guest="+name+",debug-threads=on")
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		defer r.Close()
		c.Stdin = r
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, c)
	}
	defer func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	got := QEMUs(prefix)
	if len(got) != 2 || len(got[prefix+"1"]) != 1 || got[prefix+"1"][0] != cmds[0].Process.Pid || got[prefix+"10"][0] != cmds[1].Process.Pid {
		t.Fatalf("QEMUs(%q) = %v, want %s-1 → %d and -10 → %d", prefix, got, prefix, cmds[0].Process.Pid, cmds[1].Process.Pid)
	}
	if pid, err := QEMUPid(prefix + "1"); err != nil || pid != cmds[0].Process.Pid {
		t.Errorf("QEMUPid = %d, %v", pid, err)
	}
	if _, err := QEMUPid(prefix + "2"); err == nil {
		t.Errorf("QEMUPid of no guest: no error")
	}
	if n := len(GuestQEMUs(prefix)); n != 2 {
		t.Errorf("GuestQEMUs found %d, want 2", n)
	}
}
