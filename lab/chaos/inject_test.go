package chaos

import (
	"context"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/labcloud/labcloud/internal/nstest"
	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/host"
)

// inTestNetns runs f on a locked thread inside a new network namespace
// that holds a bridge named as the lab's, and restores the namespace.
func inTestNetns(t *testing.T, f func()) {
	t.Helper()
	nstest.InNew(t, func(netns.NsHandle) {
		addBridge(t)
		f()
	})
}

func addBridge(t *testing.T) {
	t.Helper()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: lab.Bridge}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
}

func master(t *testing.T, name string) string {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if l.Attrs().MasterIndex == 0 {
		return ""
	}
	m, err := netlink.LinkByIndex(l.Attrs().MasterIndex)
	if err != nil {
		t.Fatal(err)
	}
	return m.Attrs().Name
}

// TestReplugAfterTheBridgeIsRecreated: the bridge's ports before it went
// are its ports again once it is back.
func TestReplugAfterTheBridgeIsRecreated(t *testing.T) {
	inTestNetns(t, func() {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lct0"}, PeerName: "lct1"}
		if err := netlink.LinkAdd(veth); err != nil {
			t.Fatal(err)
		}
		br, _ := netlink.LinkByName(lab.Bridge)
		if err := netlink.LinkSetMaster(veth, br); err != nil {
			t.Fatal(err)
		}
		ports, err := host.Ports(lab.Bridge)
		if err != nil {
			t.Fatal(err)
		}
		if len(ports) != 1 || ports[0] != "lct0" {
			t.Fatalf("bridge ports = %v, want [lct0]", ports)
		}
		if err := netlink.LinkDel(br); err != nil {
			t.Fatal(err)
		}
		if m := master(t, "lct0"); m != "" {
			t.Fatalf("lct0 still on %s after the bridge went", m)
		}
		addBridge(t)
		if err := host.Replug(lab.Bridge, append(ports, "gone0")); err != nil {
			t.Fatal(err)
		}
		if m := master(t, "lct0"); m != lab.Bridge {
			t.Errorf("lct0 on %q after replug, want %s", m, lab.Bridge)
		}
	})
}

func TestBridgeFlap(t *testing.T) {
	inTestNetns(t, func() {
		in := &injector{}
		undo, err := in.bridgeFlap()
		if err != nil {
			t.Fatal(err)
		}
		if l, _ := netlink.LinkByName(lab.Bridge); l.Attrs().Flags&net.FlagUp != 0 {
			t.Error("bridge still up after the flap's injection")
		}
		if err := undo(context.Background()); err != nil {
			t.Fatal(err)
		}
		if l, _ := netlink.LinkByName(lab.Bridge); l.Attrs().Flags&net.FlagUp == 0 {
			t.Error("bridge down after the flap's recovery")
		}
	})
}

func TestProcessWithCommand(t *testing.T) {
	cmd := exec.Command("sleep", "3600.5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	// Start returns once the exec has begun; the kernel fills the new
	// image's cmdline a moment later, so give it a second.
	got := 0
	for deadline := time.Now().Add(time.Second); got != cmd.Process.Pid && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		got = host.ProcessWithCommand([]string{"sleep", "3600.5"})
	}
	if got != cmd.Process.Pid {
		t.Errorf("processWithCommand = %d, want %d", got, cmd.Process.Pid)
	}
	if got := host.ProcessWithCommand([]string{"sleep", "3600.6"}); got != 0 {
		t.Errorf("processWithCommand of a command nobody runs = %d, want 0", got)
	}
}
