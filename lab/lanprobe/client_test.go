package lanprobe

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/labcloud/labcloud/internal/nstest"
)

// lan makes a bridge with address 10.97.0.1/24 in the test's namespace,
// entered (nstest.InNew), with its loopback up, and returns the bridge's
// MAC.
func lan(t *testing.T) net.HardwareAddr {
	t.Helper()
	mac, _ := net.ParseMAC("02:97:00:00:00:01") // else a port's would become the bridge's
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "lcpbr0", HardwareAddr: mac}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr("10.97.0.1/24")
	if err := netlink.AddrAdd(br, addr); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"lcpbr0", "lo"} {
		l, err := netlink.LinkByName(name)
		if err == nil {
			err = netlink.LinkSetUp(l)
		}
		if err != nil {
			t.Fatalf("%s up: %v", name, err)
		}
	}
	return mac
}

// plug plugs a client into lan's bridge, and waits until the bridge, new
// as it is, carries frames: it has had no carrier before its first port.
func plug(t *testing.T, port, addr, name string) *Client {
	t.Helper()
	c, err := New(Options{Bridge: "lcpbr0", Port: port, Addr: netip.MustParsePrefix(addr), Netns: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	h, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := waitUp(h, "lcpbr0", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestClientOnTheBridge: a client asks for the bridge's own address and
// its kernel's answer comes back through the veth; Close leaves neither
// the port nor the named namespace.
func TestClientOnTheBridge(t *testing.T) {
	nstest.InNew(t, func(netns.NsHandle) {
		brMAC := lan(t)
		name := fmt.Sprintf("lcp-test-%d", os.Getpid())
		c := plug(t, "lcp-port0", "10.97.0.5/24", name)
		if mac, err := c.Resolve(netip.MustParseAddr("10.97.0.1"), 2*time.Second); err != nil || mac.String() != brMAC.String() {
			t.Errorf("Resolve(the bridge) = %v, %v; want %s", mac, err, brMAC)
		}
		if mac, err := c.Resolve(netip.MustParseAddr("10.97.0.99"), 300*time.Millisecond); err != nil || mac != nil {
			t.Errorf("Resolve(nobody) = %v, %v; want nil, nil", mac, err)
		}
		if mac, err := c.Neighbour(netip.MustParseAddr("10.97.0.1")); err != nil || mac != nil {
			t.Errorf("the client's kernel has %v %v for the bridge before it sent anything", mac, err)
		}
		if _, err := os.Stat("/run/netns/" + name); err != nil {
			t.Errorf("no named namespace: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if _, err := netlink.LinkByName("lcp-port0"); err == nil {
			t.Error("the port is left after Close")
		}
		if _, err := os.Stat("/run/netns/" + name); err == nil {
			t.Error("the named namespace is left after Close")
		}
	})
}

// TestProbeCountsEveryAnswer: one address answered once, one with two MACs
// (a split brain), one not at all, answered by a responder on the LAN.
func TestProbeCountsEveryAnswer(t *testing.T) {
	nstest.InNew(t, func(netns.NsHandle) {
		lan(t)
		prober, responder := plug(t, "lcp-port1", "10.97.0.2/24", ""), plug(t, "lcp-port2", "10.97.0.3/24", "")
		once, twice, nobody := netip.MustParseAddr("10.97.0.200"), netip.MustParseAddr("10.97.0.201"), netip.MustParseAddr("10.97.0.202")
		macA, _ := net.ParseMAC("02:00:00:00:00:0a")
		macB, _ := net.ParseMAC("02:00:00:00:00:0b")
		answer(t, responder, map[netip.Addr][]net.HardwareAddr{once: {macA}, twice: {macA, macB}})

		capture, err := prober.Capture()
		if err != nil {
			t.Fatal(err)
		}
		defer capture.Close()
		start := time.Now()
		got, err := capture.Probe(context.Background(), []netip.Addr{once, twice, nobody}, 300*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"02:00:00:00:00:0a"}; !slices.Equal(got[once], want) {
			t.Errorf("%s answered by %v, want %v", once, got[once], want)
		}
		if want := []string{"02:00:00:00:00:0a", "02:00:00:00:00:0b"}; !slices.Equal(got[twice], want) {
			t.Errorf("%s answered by %v, want %v", twice, got[twice], want)
		}
		if len(got[nobody]) != 0 {
			t.Errorf("%s answered by %v, want nobody", nobody, got[nobody])
		}
		// Unanswered addresses are asked twice: two waits, no more.
		if d := time.Since(start); d < 600*time.Millisecond || d > 2*time.Second {
			t.Errorf("probe took %s, want two 300 ms waits", d)
		}
		if f, ok := capture.Answered(once, start); !ok || f.MAC.String() != macA.String() || f.At.Before(start) {
			t.Errorf("Answered(%s) = %+v, %v", once, f, ok)
		}
	})
}

// answer has c answer every ARP request for the addresses of answers, with
// each of their MACs, until the test ends.
func answer(t *testing.T, c *Client, answers map[netip.Addr][]net.HardwareAddr) {
	t.Helper()
	var r *arp.Client
	if err := c.Do(func() error {
		ifi, err := net.InterfaceByName(Interface)
		if err == nil {
			r, err = arp.Dial(ifi)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			_ = r.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			req, _, err := r.Read()
			if err != nil || req.Operation != arp.OperationRequest {
				continue
			}
			for _, mac := range answers[req.TargetIP] {
				if reply, err := arp.NewPacket(arp.OperationReply, mac, req.TargetIP, req.SenderHardwareAddr, req.SenderIP); err == nil {
					_ = r.WriteTo(reply, req.SenderHardwareAddr)
				}
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		r.Close()
	})
}

// TestCaptureRecordsAnnouncements: a node's gratuitous ARP in both forms
// and an unsolicited advertisement reach a client's capture, stamped on
// arrival; what another address is told is not this one's.
func TestCaptureRecordsAnnouncements(t *testing.T) {
	nstest.InNew(t, func(netns.NsHandle) {
		lan(t)
		client, node := plug(t, "lcp-port3", "10.97.0.4/24", ""), plug(t, "lcp-port4", "10.97.0.6/24", "")
		capture, err := client.Capture()
		if err != nil {
			t.Fatal(err)
		}
		defer capture.Close()
		nodeMAC, err := node.MAC()
		if err != nil {
			t.Fatal(err)
		}
		vip, vip6, other := netip.MustParseAddr("10.97.0.100"), netip.MustParseAddr("fd97::100"), netip.MustParseAddr("10.97.0.101")
		since := time.Now()
		send(t, node, arpFrame(t, arp.OperationRequest, nodeMAC, vip, vip, ethernet.Broadcast, ethernet.EtherTypeARP),
			arpFrame(t, arp.OperationReply, nodeMAC, vip, vip, ethernet.Broadcast, ethernet.EtherTypeARP), naFrame(t, nodeMAC, vip6, false, true))
		var got []Frame
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && len(got) < 2; time.Sleep(10 * time.Millisecond) {
			got = capture.Announced(vip, nodeMAC, since)
		}
		if len(got) != 2 || got[0].Op != arp.OperationRequest || got[1].Op != arp.OperationReply || got[0].At.Before(since) {
			t.Errorf("announcements of %s: %+v, want the request form then the reply form", vip, got)
		}
		if got := capture.Announced(vip6, nil, since); len(got) != 1 || got[0].MAC.String() != nodeMAC.String() {
			t.Errorf("announcements of %s: %+v, want one naming %s", vip6, got, nodeMAC)
		}
		if got := capture.Announced(other, nil, since); len(got) != 0 {
			t.Errorf("announcements of %s: %+v, want none", other, got)
		}
		if got := capture.Announced(vip, client.mustMAC(t), since); len(got) != 0 {
			t.Errorf("announcements of %s naming the client: %+v, want none", vip, got)
		}
	})
}

func (c *Client) mustMAC(t *testing.T) net.HardwareAddr {
	t.Helper()
	mac, err := c.MAC()
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

// send writes Ethernet frames from c's interface.
func send(t *testing.T, c *Client, frames ...[]byte) {
	t.Helper()
	if err := c.Do(func() error {
		ifi, err := net.InterfaceByName(Interface)
		if err != nil {
			return err
		}
		conn, err := packet.Listen(ifi, packet.Raw, unix.ETH_P_ALL, nil)
		if err != nil {
			return err
		}
		defer conn.Close()
		for _, f := range frames {
			if _, err := conn.WriteTo(f, &packet.Addr{HardwareAddr: ethernet.Broadcast}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestHostname: the client's HTTP is dialled from its namespace, both
// families' addresses and host:port alike.
func TestHostname(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		l, err := net.Listen(network, map[string]string{"tcp4": "127.0.0.1:0", "tcp6": "[::1]:0"}[network])
		if err != nil {
			t.Skipf("%s loopback: %v", network, err)
		}
		serve(t, l, "pod-"+network)
		if got := Hostname(l.Addr().String(), time.Second); got != "pod-"+network {
			t.Errorf("Hostname(%s) = %q", l.Addr(), got)
		}
	}
	// A bare IPv6 address means port 80 in brackets, not a malformed URL.
	if got := Hostname("::1", 200*time.Millisecond); got != "" {
		t.Errorf("Hostname(::1) = %q with nothing on port 80", got)
	}
	nstest.InNew(t, func(netns.NsHandle) {
		lan(t)
		client, node := plug(t, "lcp-port5", "10.97.0.7/24", ""), plug(t, "lcp-port6", "10.97.0.8/24", "")
		var l net.Listener
		if err := node.Do(func() (err error) { l, err = net.Listen("tcp", "10.97.0.8:0"); return err }); err != nil {
			t.Fatal(err)
		}
		serve(t, l, "the node")
		if got := client.Hostname(l.Addr().String(), time.Second); got != "the node" {
			t.Errorf("client.Hostname(%s) = %q", l.Addr(), got)
		}
		here, err := net.Listen("tcp", "127.0.0.1:0") // in the test's namespace
		if err != nil {
			t.Fatal(err)
		}
		serve(t, here, "the test")
		if got := client.Hostname(here.Addr().String(), 300*time.Millisecond); got != "" {
			t.Errorf("the client reached %s in the test's namespace: %q", here.Addr(), got)
		}
	})
}

// serve answers every request on l with body until the test ends.
func serve(t *testing.T, l net.Listener, body string) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, body) })}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
}
