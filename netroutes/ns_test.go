package netroutes

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// A lab in a throwaway network namespace: a bridge with an IPv4 and an IPv6
// subnet and veth "nodes" plugged into it. Nothing touches the host's stack.

const (
	labBridge = "labbr0"
	labV4     = "192.168.100.1/24"
	labV6     = "fd00:100::1/64"
)

var nsSeq atomic.Uint64

type testNS struct {
	name string
	h    *netlink.Handle
	done bool
}

// newTestNS creates a named namespace (so `ip -n` reaches it) and a netlink
// handle bound to it. The calling thread is switched back at once.
func newTestNS(tb testing.TB) *testNS {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("netroutes: privileged test needs root to create network namespaces")
	}
	name := fmt.Sprintf("lcroutes-%d-%d", os.Getpid(), nsSeq.Add(1))

	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		tb.Fatalf("get current netns: %v", err)
	}
	ns, nsErr := netns.NewNamed(name) // also moves this thread into it
	if err := netns.Set(orig); err != nil {
		// Leave the thread locked: the runtime discards it when the test
		// goroutine ends, so no other goroutine runs in the wrong namespace.
		tb.Fatalf("restore original netns: %v", err)
	}
	orig.Close()
	runtime.UnlockOSThread()
	if nsErr != nil {
		tb.Fatalf("create netns %s: %v", name, nsErr)
	}
	defer ns.Close()

	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		_ = netns.DeleteNamed(name)
		tb.Fatalf("netlink handle in %s: %v", name, err)
	}
	n := &testNS{name: name, h: h}
	tb.Cleanup(func() { n.Close(tb) })
	return n
}

// handle is a netlink handle of its own in the namespace, for a Manager
// (New makes its handle's requests strictly checked).
func (n *testNS) handle(tb testing.TB) *netlink.Handle {
	tb.Helper()
	ns, err := netns.GetFromName(n.name)
	if err != nil {
		tb.Fatalf("open netns %s: %v", n.name, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		tb.Fatalf("netlink handle in %s: %v", n.name, err)
	}
	tb.Cleanup(h.Close)
	return h
}

func (n *testNS) Close(tb testing.TB) {
	if n.done {
		return
	}
	n.done = true
	n.h.Close()
	if err := netns.DeleteNamed(n.name); err != nil {
		tb.Errorf("delete netns %s: %v", n.name, err)
	}
}

// addBridge creates the lab bridge with its subnets and nodes veth ports.
func (n *testNS) addBridge(tb testing.TB, nodes int, subnets ...string) netlink.Link {
	tb.Helper()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: labBridge}}
	if err := n.h.LinkAdd(br); err != nil {
		tb.Fatalf("add bridge: %v", err)
	}
	for _, s := range subnets {
		ip, ipn, err := net.ParseCIDR(s)
		if err != nil {
			tb.Fatal(err)
		}
		ipn.IP = ip
		// NODAD: the address is usable at once instead of after DAD.
		if err := n.h.AddrAdd(br, &netlink.Addr{IPNet: ipn, Flags: unix.IFA_F_NODAD}); err != nil {
			tb.Fatalf("add %s to bridge: %v", s, err)
		}
	}
	for i := range nodes {
		veth := &netlink.Veth{
			LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("node%d", i), MasterIndex: br.Index},
			PeerName:  fmt.Sprintf("node%d-p", i),
		}
		if err := n.h.LinkAdd(veth); err != nil {
			tb.Fatalf("add veth node%d: %v", i, err)
		}
		for _, name := range []string{veth.Name, veth.PeerName} {
			if err := n.ip(tb, "link", "set", name, "up"); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if err := n.h.LinkSetUp(br); err != nil {
		tb.Fatalf("bridge up: %v", err)
	}
	link, err := n.h.LinkByName(labBridge)
	if err != nil {
		tb.Fatal(err)
	}
	return link
}

// ip runs iproute2 inside the namespace.
func (n *testNS) ip(tb testing.TB, args ...string) error {
	tb.Helper()
	out, err := exec.Command("ip", append([]string{"-n", n.name}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// show returns `ip route show` output for both families in the namespace.
func (n *testNS) show(tb testing.TB, args ...string) string {
	tb.Helper()
	var b strings.Builder
	for _, fam := range []string{"-4", "-6"} {
		out, err := exec.Command("ip", append([]string{"-n", n.name, fam, "route", "show"}, args...)...).CombinedOutput()
		if err != nil {
			tb.Fatalf("ip route show %v: %v: %s", args, err, out)
		}
		b.Write(out)
	}
	return b.String()
}
