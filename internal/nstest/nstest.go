// Package nstest runs test code inside network namespaces the test makes,
// so that tests touch real netlink and sockets without touching the host.
package nstest

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Handle returns a netlink handle in a fresh network namespace that lives
// as long as the test; the test's own thread never leaves its namespace.
// It skips the test when not run as root.
func Handle(t testing.TB) *netlink.Handle {
	t.Helper()
	var nl *netlink.Handle
	InNew(t, func(ns netns.NsHandle) {
		h, err := netlink.NewHandleAt(ns)
		if err != nil {
			t.Fatal(err)
		}
		nl = h
	})
	t.Cleanup(nl.Close)
	return nl
}

// InNew runs f on a locked thread inside a new, empty network namespace
// (ns), and restores the thread's namespace afterwards. It skips the test
// when not run as root.
func InNew(t testing.TB, f func(ns netns.NsHandle)) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, bridges, veth")
	}
	in(t, netns.New, f)
}

// InNamed runs f on a locked thread inside the named network namespace
// (/run/netns/NAME, as Named makes), and restores the thread's namespace
// afterwards: sockets f opens stay in it.
func InNamed(t testing.TB, name string, f func()) {
	t.Helper()
	in(t, func() (netns.NsHandle, error) {
		ns, err := netns.GetFromName(name)
		if err == nil {
			err = netns.Set(ns)
		}
		return ns, err
	}, func(netns.NsHandle) { f() })
}

// in runs f on a locked thread switched into the namespace enter returns.
func in(t testing.TB, enter func() (netns.NsHandle, error), f func(ns netns.NsHandle)) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := enter()
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

// Named makes a network namespace /run/netns/NAME-<pid> that processes can
// enter ("ip netns exec"), with its loopback up, deleted when the test
// ends. It skips the test when not run as root.
func Named(t testing.TB, name string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces")
	}
	ns := fmt.Sprintf("%s-%d", name, os.Getpid())
	_ = exec.Command("ip", "netns", "del", ns).Run()
	IP(t, "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	IP(t, "-n", ns, "link", "set", "lo", "up")
	return ns
}

// IP runs ip(8) with args and fails the test if it fails.
func IP(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// Link joins two named namespaces with a veth pair, each end up with its
// addresses (CIDR notation).
func Link(t testing.TB, nsA, ifA string, addrsA []string, nsB, ifB string, addrsB []string) {
	t.Helper()
	IP(t, "link", "add", ifA, "netns", nsA, "type", "veth", "peer", "name", ifB, "netns", nsB)
	for _, end := range []struct {
		ns, dev string
		addrs   []string
	}{{nsA, ifA, addrsA}, {nsB, ifB, addrsB}} {
		for _, a := range end.addrs {
			IP(t, "-n", end.ns, "addr", "add", a, "dev", end.dev, "nodad")
		}
		IP(t, "-n", end.ns, "link", "set", end.dev, "up")
	}
}
