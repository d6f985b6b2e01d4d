package nodeagent

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// inNewNetns runs fn on the test goroutine, locked to its thread, inside a
// fresh network namespace, and restores the original namespace afterwards
// (also when fn calls t.Fatal).
func inNewNetns(t *testing.T, fn func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces); run the tests as root")
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("get netns: %v", err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("new netns: %v", err)
	}
	defer ns.Close()
	defer func() {
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: the runtime discards it.
			t.Errorf("restore netns: %v", err)
			return
		}
		runtime.UnlockOSThread()
	}()
	fn()
}

func TestNetlinkInterfaces(t *testing.T) {
	inNewNetns(t, func() {
		ifs, err := NewNetlinkInterfaces()
		if err != nil {
			t.Fatal(err)
		}
		defer ifs.Close()
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			t.Fatal(err)
		}

		ctx := context.Background()
		// pod0: created once, up, addresses come and go.
		if err := ifs.EnsureDummy(PodInterface); errors.Is(err, unix.EOPNOTSUPP) {
			t.Logf("this kernel has no dummy interfaces (%v): not testing pod0 here", err)
		} else if err != nil {
			t.Fatal(err)
		} else {
			testPod0(t, ifs)
		}

		// lo: VIPs next to the loopback addresses, served by the name server.
		want := VIPPrefixes(ips("192.168.100.10", "fd00::10"))
		if err := syncAddrs(ctx, ifs, VIPInterface, want, OwnedOnLo); err != nil {
			t.Fatal(err)
		}
		got, err := ifs.Addrs(VIPInterface)
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(got, comparePrefix)
		if w := pfx("127.0.0.1/8", "192.168.100.10/32", "::1/128", "fd00::10/128"); !slices.Equal(got, w) {
			t.Errorf("lo addresses = %v, want %v", got, w)
		}
		s := NewNameServer("node-9", nil)
		defer s.Close()
		eps := aps("192.168.100.10:8080", "[fd00::10]:8080")
		if err := s.Start(ctx, eps); err != nil { // listens from this thread: in the namespace
			t.Fatal(err)
		}
		for _, ep := range eps {
			if body, err := rawGet(ep.String()); err != nil || body != "node-9\n" {
				t.Errorf("GET %s = %q, %v", ep, body, err)
			}
		}
		s.Stop(ctx, eps)
		if err := syncAddrs(ctx, ifs, VIPInterface, nil, OwnedOnLo); err != nil {
			t.Fatal(err)
		}
		got, _ = ifs.Addrs(VIPInterface)
		slices.SortFunc(got, comparePrefix)
		if w := pfx("127.0.0.1/8", "::1/128"); !slices.Equal(got, w) {
			t.Errorf("lo addresses after removal = %v, want %v", got, w)
		}
		// Removing an address that is gone is not an error.
		if err := ifs.DelAddr(VIPInterface, netip.MustParsePrefix("192.168.100.10/32")); err != nil {
			t.Errorf("DelAddr(absent) = %v", err)
		}
	})
}

func testPod0(t *testing.T, ifs *NetlinkInterfaces) {
	ctx := context.Background()
	if err := ifs.EnsureDummy(PodInterface); err != nil { // again: no-op
		t.Fatal(err)
	}
	l, err := netlink.LinkByName(PodInterface)
	if err != nil || l.Type() != "dummy" || l.Attrs().Flags&net.FlagUp == 0 {
		t.Fatalf("pod0 = %+v, %v; want an up dummy", l, err)
	}
	if err := syncAddrs(ctx, ifs, PodInterface, pfx("10.244.1.1/24"), OwnedOnPod0); err != nil {
		t.Fatal(err)
	}
	if err := syncAddrs(ctx, ifs, PodInterface, pfx("10.244.2.1/24"), OwnedOnPod0); err != nil {
		t.Fatal(err)
	}
	got, err := ifs.Addrs(PodInterface)
	if err != nil {
		t.Fatal(err)
	}
	got = slices.DeleteFunc(got, func(p netip.Prefix) bool { return !OwnedOnPod0(p) })
	if want := pfx("10.244.2.1/24"); !slices.Equal(got, want) {
		t.Errorf("pod0 addresses = %v, want %v", got, want)
	}
}

// rawGet does an HTTP GET on the calling thread (so in its namespace).
func rawGet(addr string) (string, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
