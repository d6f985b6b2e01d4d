// Package nstest runs test code inside network namespaces the test makes,
// so that tests touch real netlink and sockets without touching the host.
package nstest

import (
	"os"
	"runtime"
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
