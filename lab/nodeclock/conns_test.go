package nodeclock

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/labcloud/labcloud/internal/nstest"
)

// In a namespace of its own, for each family: two idle connections to a
// server (a watcher that sends nothing) and one to another port; the
// reset aborts the two, whose next read fails at once, and leaves the
// third.
func TestResetConnectionsAbortsIdleClients(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "::1"} {
		nstest.InNew(t, func(netns.NsHandle) {
			lo, err := netlink.LinkByName("lo")
			if err == nil {
				err = netlink.LinkSetUp(lo)
			}
			if err != nil {
				t.Fatal(err)
			}
			api, other := listen(t, host), listen(t, host)
			c1, c2, c3 := dial(t, api), dial(t, api), dial(t, other)
			n, err := ResetConnections(netip.MustParseAddrPort(api.Addr().String()))
			if err != nil || n != 2 {
				t.Fatalf("%s: reset %d, %v; want the 2 connections to the API server", host, n, err)
			}
			for i, c := range []net.Conn{c1, c2} {
				_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
				if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNABORTED) {
					t.Errorf("%s: connection %d read %v, want ECONNABORTED", host, i+1, err)
				}
			}
			_ = c3.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			if _, err := c3.Read(make([]byte, 1)); err == nil || errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, io.EOF) {
				t.Errorf("%s: the other port's connection read %v, want it open (a timeout)", host, err)
			}
		})
	}
}

func listen(t *testing.T, host string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	var accepted []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted = append(accepted, c)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		for _, c := range accepted {
			c.Close()
		}
	})
	return l
}

func dial(t *testing.T, l net.Listener) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
