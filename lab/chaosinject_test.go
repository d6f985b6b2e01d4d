package lab

import (
	"context"
	"net"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// inTestNetns runs f on a locked thread inside a new network namespace
// that holds a bridge named as the lab's, and restores the namespace.
func inTestNetns(t *testing.T, f func()) {
	t.Helper()
	inNewNetns(t, func(netns.NsHandle) {
		addBridge(t)
		f()
	})
}

// inNewNetns runs f on a locked thread inside a new, empty network
// namespace (ns), and restores the thread's namespace afterwards.
func inNewNetns(t *testing.T, f func(ns netns.NsHandle)) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, bridges, veth")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(err) // the locked thread must not run anything else
		}
	}()
	f(ns)
}

func addBridge(t *testing.T) {
	t.Helper()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: Bridge}}
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
		br, _ := netlink.LinkByName(Bridge)
		if err := netlink.LinkSetMaster(veth, br); err != nil {
			t.Fatal(err)
		}
		ports, err := bridgePorts()
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
		if err := replug(append(ports, "gone0")); err != nil {
			t.Fatal(err)
		}
		if m := master(t, "lct0"); m != Bridge {
			t.Errorf("lct0 on %q after replug, want %s", m, Bridge)
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
		if l, _ := netlink.LinkByName(Bridge); l.Attrs().Flags&net.FlagUp != 0 {
			t.Error("bridge still up after the flap's injection")
		}
		if err := undo(context.Background()); err != nil {
			t.Fatal(err)
		}
		if l, _ := netlink.LinkByName(Bridge); l.Attrs().Flags&net.FlagUp == 0 {
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
		got = processWithCommand([]string{"sleep", "3600.5"})
	}
	if got != cmd.Process.Pid {
		t.Errorf("processWithCommand = %d, want %d", got, cmd.Process.Pid)
	}
	if got := processWithCommand([]string{"sleep", "3600.6"}); got != 0 {
		t.Errorf("processWithCommand of a command nobody runs = %d, want 0", got)
	}
}
