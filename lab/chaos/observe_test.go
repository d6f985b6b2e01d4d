package chaos

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/labcloud/labcloud/internal/nstest"
	"github.com/labcloud/labcloud/lab"
)

// TestARPProberCountsEveryAnswer runs the prober in a client namespace
// against a responder in another, joined by a veth pair: one VIP answered
// once, one answered with two MACs (a split brain), one not at all.
func TestARPProberCountsEveryAnswer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and raw ARP sockets")
	}
	client, responder := fmt.Sprintf("lcct-c-%d", os.Getpid()), fmt.Sprintf("lcct-r-%d", os.Getpid())
	ipCmd := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", client).Run()
		_ = exec.Command("ip", "netns", "del", responder).Run()
	})
	ipCmd("netns", "add", client)
	ipCmd("netns", "add", responder)
	ipCmd("-n", client, "link", "add", "c0", "type", "veth", "peer", "name", "r0", "netns", responder)
	ipCmd("-n", client, "addr", "add", "10.99.0.2/24", "dev", "c0")
	ipCmd("-n", responder, "addr", "add", "10.99.0.3/24", "dev", "r0")
	ipCmd("-n", client, "link", "set", "c0", "up")
	ipCmd("-n", responder, "link", "set", "r0", "up")

	once, twice, nobody := netip.MustParseAddr("10.99.0.200"), netip.MustParseAddr("10.99.0.201"), netip.MustParseAddr("10.99.0.202")
	macA, _ := net.ParseMAC("02:00:00:00:00:0a")
	macB, _ := net.ParseMAC("02:00:00:00:00:0b")
	answers := map[netip.Addr][]net.HardwareAddr{once: {macA}, twice: {macA, macB}}

	r, err := newARPProber(nsHandle(t, responder), "r0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			_ = r.c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			req, _, err := r.c.Read()
			if err != nil || req.Operation != arp.OperationRequest {
				continue
			}
			for _, mac := range answers[req.TargetIP] {
				reply, err := arp.NewPacket(arp.OperationReply, mac, req.TargetIP, req.SenderHardwareAddr, req.SenderIP)
				if err == nil {
					_ = r.c.WriteTo(reply, req.SenderHardwareAddr)
				}
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		r.Close()
	})

	p, err := newARPProber(nsHandle(t, client), "c0")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	start := time.Now()
	got, err := p.Probe(ctx, []netip.Addr{once, twice, nobody}, 300*time.Millisecond)
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
	// Unanswered VIPs are asked twice: two waits, no more.
	if d := time.Since(start); d < 600*time.Millisecond || d > 2*time.Second {
		t.Errorf("probe took %s, want two 300 ms waits", d)
	}
}

func nsHandle(t *testing.T, name string) netns.NsHandle {
	t.Helper()
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// TestLANClientReachesTheBridge plugs the LAN client into a bridge named as
// the lab's, in a namespace of the test's, and asks for the bridge's own
// address: the kernel's answer must come back through the veth.
func TestLANClientReachesTheBridge(t *testing.T) {
	// The test's namespace stands in for the lab's.
	nstest.InNew(t, func(netns.NsHandle) { lanClientReachesTheBridge(t) })
}

func lanClientReachesTheBridge(t *testing.T) {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: lab.Bridge}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr(lab.Addressing{}.Gateway() + "/24")
	if err := netlink.AddrAdd(br, addr); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	lan, err := lanClientUp(chaosClientAddr(lab.Addressing{}))
	if err != nil {
		t.Fatal(err)
	}
	p, err := newARPProber(lan.ns, chaosVethClient)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	gw := netip.MustParseAddr(lab.Addressing{}.Gateway())
	var got map[netip.Addr][]string
	for i := 0; i < 10 && len(got[gw]) == 0; i++ { // the veth may take a moment to forward
		if got, err = p.Probe(context.Background(), []netip.Addr{gw}, 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	link, _ := netlink.LinkByName(lab.Bridge)
	if want := []string{link.Attrs().HardwareAddr.String()}; !slices.Equal(got[gw], want) {
		t.Errorf("%s answered by %v, want the bridge's %v", gw, got[gw], want)
	}
	lan.Close()
	if _, err := netlink.LinkByName(chaosVethLab); err == nil {
		t.Errorf("%s left behind by Close", chaosVethLab)
	}
}
