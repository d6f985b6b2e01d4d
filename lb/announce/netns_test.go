package announce

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// The privileged tests build a small lab of network namespaces:
//
//	host:   bridge br-lab 10.77.0.1/24 fd77::1/64, where the Announcer's raw sockets live
//	node1:  eth0 10.77.0.11/24 fd77::11/64, VIPs on lo (arp_ignore=1, arp_announce=2)
//	node2:  eth0 10.77.0.12/24 fd77::12/64, VIPs on lo (same)
//	client: eth0 10.77.0.50/24 fd77::50/64
//	rogue:  eth0 10.77.0.200/24 fd77::c8/64, a host that really owns an address
//
// each attached to the bridge by a veth pair. The namespaces are unnamed: they
// disappear when the test closes its handles and sockets, even if it dies.

var (
	labBridgeMAC = mustMAC("02:77:00:00:00:01")
	labNodeMAC   = [2]net.HardwareAddr{mustMAC("02:77:00:00:00:11"), mustMAC("02:77:00:00:00:12")}
	labClientMAC = mustMAC("02:77:00:00:00:50")
	labRogueMAC  = mustMAC("02:77:00:00:00:66")

	labVIP      = netip.MustParseAddr("10.77.0.100")
	labRogueIP  = netip.MustParseAddr("10.77.0.200")
	labFreeIP   = netip.MustParseAddr("10.77.0.201")
	labUnowned  = netip.MustParseAddr("10.77.0.150")
	labEchoPort = 7777

	labVIP6     = netip.MustParseAddr("fd77::100")
	labRogueIP6 = netip.MustParseAddr("fd77::c8")
)

// v6 is the lab's IPv6 address of a peer whose IPv4 address is ip: the
// same last byte, in hex.
func v6(ip netip.Addr) netip.Addr {
	b := netip.MustParseAddr("fd77::").As16()
	b[15] = ip.As4()[3]
	return netip.AddrFrom16(b)
}

// noDAD is an IPv6 address that needs no duplicate-address detection, so
// that tests do not wait a second for it.
func noDAD(ip netip.Addr, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(bits, 128)}, Flags: unix.IFA_F_NODAD}
}

func requireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("skipping: needs root for network namespaces, veth, bridges and raw sockets (run the tests as root)")
	}
}

// newNS creates an unnamed network namespace without leaving the caller in it.
func newNS() (netns.NsHandle, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return netns.None(), err
	}
	defer orig.Close()
	ns, err := netns.New() // moves this thread into it
	if err != nil {
		if serr := netns.Set(orig); serr != nil {
			return netns.None(), errors.Join(err, serr)
		}
		runtime.UnlockOSThread()
		return netns.None(), err
	}
	if err := netns.Set(orig); err != nil {
		ns.Close()
		return netns.None(), fmt.Errorf("restoring the original namespace: %w", err)
	}
	runtime.UnlockOSThread()
	return ns, nil
}

type labPeer struct {
	ns  netns.NsHandle
	h   *netlink.Handle
	mac net.HardwareAddr
	ip  netip.Addr
}

type lab struct {
	tb     testing.TB
	host   labPeer
	bridge netlink.Link
	nodes  [2]labPeer
	client labPeer
	rogue  labPeer

	a       *Announcer
	stopRun func()
	logs    ktesting.Buffer // what the Announcer logged; nil in benchmarks
}

func (l *lab) check(err error, what string) {
	l.tb.Helper()
	if err != nil {
		l.tb.Fatalf("%s: %v", what, err)
	}
}

func (l *lab) cleanup(f func()) { l.tb.Cleanup(f) }

// newLab builds the namespaces and starts an Announcer on the bridge.
func newLab(tb testing.TB, opts Options) *lab {
	tb.Helper()
	requireRoot(tb)
	l := &lab{tb: tb}
	start := time.Now()

	peer := func(mac net.HardwareAddr, ip string) labPeer {
		ns, err := newNS()
		l.check(err, "creating a namespace")
		l.cleanup(func() { ns.Close() })
		h, err := netlink.NewHandleAt(ns)
		l.check(err, "netlink handle")
		l.cleanup(h.Close)
		lo, err := h.LinkByName("lo")
		l.check(err, "lo")
		l.check(h.LinkSetUp(lo), "lo up")
		var addr netip.Addr
		if ip != "" {
			addr = netip.MustParseAddr(ip)
		}
		return labPeer{ns: ns, h: h, mac: mac, ip: addr}
	}
	l.host = peer(labBridgeMAC, "10.77.0.1")
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br-lab", HardwareAddr: labBridgeMAC}}
	l.check(l.host.h.LinkAdd(br), "adding the bridge")
	bridge, err := l.host.h.LinkByName("br-lab")
	l.check(err, "bridge")
	l.bridge = bridge
	l.check(l.host.h.AddrAdd(bridge, &netlink.Addr{IPNet: prefix("10.77.0.1/24")}), "bridge address")
	l.check(l.host.h.AddrAdd(bridge, noDAD(v6(l.host.ip), 64)), "bridge IPv6 address")
	l.check(l.host.h.LinkSetUp(bridge), "bridge up")

	attach := func(name string, p labPeer) {
		veth := &netlink.Veth{
			LinkAttrs:        netlink.LinkAttrs{Name: "p-" + name},
			PeerName:         "eth0",
			PeerHardwareAddr: p.mac,
			PeerNamespace:    netlink.NsFd(int(p.ns)),
		}
		l.check(l.host.h.LinkAdd(veth), "adding veth for "+name)
		hostEnd, err := l.host.h.LinkByName("p-" + name)
		l.check(err, "host end of "+name)
		l.check(l.host.h.LinkSetMaster(hostEnd, bridge), "enslaving "+name)
		l.check(l.host.h.LinkSetUp(hostEnd), "host end up")
		eth0, err := p.h.LinkByName("eth0")
		l.check(err, "eth0 of "+name)
		l.check(p.h.AddrAdd(eth0, &netlink.Addr{IPNet: prefix(p.ip.String() + "/24")}), "address of "+name)
		l.check(p.h.AddrAdd(eth0, noDAD(v6(p.ip), 64)), "IPv6 address of "+name)
		if name != "rogue" {
			// A tentative link-local address keeps a node from
			// resolving anyone for a second; the rogue's detection is
			// what a test watches.
			l.check(inNamespace(p.ns, func() error { return writeSysctl("net/ipv6/conf/eth0/accept_dad", "0") }), "accept_dad")
		}
		l.check(p.h.LinkSetUp(eth0), "eth0 up")
	}
	for i := range l.nodes {
		l.nodes[i] = peer(labNodeMAC[i], fmt.Sprintf("10.77.0.1%d", i+1))
		attach(fmt.Sprintf("node%d", i+1), l.nodes[i])
		n := l.nodes[i]
		lo, err := n.h.LinkByName("lo")
		l.check(err, "lo")
		// The VIP is local on the node, for kube-proxy's sake, but the node
		// never answers ARP for it: only the announcer does.
		l.check(n.h.AddrAdd(lo, &netlink.Addr{IPNet: prefix(labVIP.String() + "/32")}), "VIP on lo")
		l.check(n.h.AddrAdd(lo, noDAD(labVIP6, 128)), "IPv6 VIP on lo")
		l.check(inNamespace(n.ns, func() error {
			for _, kv := range [][2]string{
				{"net/ipv4/conf/all/arp_ignore", "1"},
				{"net/ipv4/conf/all/arp_announce", "2"},
			} {
				if err := os.WriteFile("/proc/sys/"+kv[0], []byte(kv[1]), 0o644); err != nil {
					return err
				}
			}
			return nil
		}), "node sysctls")
	}
	l.client = peer(labClientMAC, "10.77.0.50")
	attach("client", l.client)
	l.rogue = peer(labRogueMAC, labRogueIP.String())
	attach("rogue", l.rogue)

	// Wait for the bridge to carry traffic.
	deadline := time.Now().Add(5 * time.Second)
	for {
		link, err := l.host.h.LinkByIndex(bridge.Attrs().Index)
		l.check(err, "bridge state")
		if link.Attrs().OperState == netlink.OperUp {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("bridge not up: %v", link.Attrs().OperState)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The bridge is up as soon as one port forwards, but a port starts to
	// forward only once the kernel's link watch has seen its carrier (which
	// lags under load): until then the bridge drops what the peer sends.
	// Wait until each peer's frames reach the host.
	for _, p := range append(l.nodes[:], l.client, l.rogue) {
		l.waitBridged(p, deadline)
	}

	// The announcer's raw socket is opened inside the host namespace.
	l.check(inNamespace(l.host.ns, func() error {
		ifi, err := net.InterfaceByName("br-lab")
		if err != nil {
			return err
		}
		l.a, err = New(ifi, l.host.h, opts)
		return err
	}), "New")
	ctx, cancel := context.WithCancel(testContext(tb))
	if u, ok := klog.FromContext(ctx).GetSink().(ktesting.Underlier); ok {
		l.logs = u.GetBuffer()
	}
	done := make(chan error, 1)
	go func() { done <- l.a.Run(ctx) }()
	var once sync.Once
	l.stopRun = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					tb.Errorf("Run: %v", err)
				}
			case <-time.After(5 * time.Second):
				tb.Errorf("Run did not stop within 5s")
			}
			l.a.Close()
		})
	}
	l.cleanup(l.stopRun)
	<-l.a.started
	tb.Logf("lab up in %v", time.Since(start).Round(time.Millisecond))
	return l
}

// waitBridged returns once the host answers an ARP request from p for the
// bridge's address, i.e. p's port forwards; it fails the test at deadline.
func (l *lab) waitBridged(p labPeer, deadline time.Time) {
	l.tb.Helper()
	c := l.arpClient(p)
	defer c.Close()
	bridgeIP := netip.MustParseAddr("10.77.0.1")
	for {
		if err := c.Request(bridgeIP); err != nil {
			l.tb.Fatalf("ARP request from %s: %v", p.ip, err)
		}
		l.check(c.SetReadDeadline(time.Now().Add(20*time.Millisecond)), "read deadline")
		for {
			r, _, err := c.Read()
			if err != nil {
				break
			}
			if r.Operation == arp.OperationReply && r.SenderIP == bridgeIP {
				return
			}
		}
		if time.Now().After(deadline) {
			l.tb.Fatalf("the bridge does not carry %s's frames", p.ip)
		}
	}
}

func testContext(tb testing.TB) context.Context {
	if _, ok := tb.(*testing.B); ok {
		return klog.NewContext(context.Background(), logr.Discard())
	}
	// Kept in memory too, so that a test can count what a flood costs.
	logger := ktesting.NewLogger(tb, ktesting.NewConfig(ktesting.BufferLogs(true)))
	return klog.NewContext(context.Background(), logger)
}

func prefix(s string) *net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return n
}

// arpClient opens an ARP client on eth0 inside p's namespace.
func (l *lab) arpClient(p labPeer) *arp.Client {
	l.tb.Helper()
	var c *arp.Client
	l.check(inNamespace(p.ns, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		pc, err := packet.Listen(ifi, packet.Raw, unix.ETH_P_ARP, nil)
		if err != nil {
			return err
		}
		c, err = arp.New(ifi, pc)
		if err != nil {
			pc.Close()
		}
		return err
	}), "ARP client")
	l.cleanup(func() { c.Close() })
	return c
}

// ask sends an ARP request for ip from c and returns the first answer (packet
// and frame) within d, or nil. Gratuitous replies are not answers.
func ask(tb testing.TB, c *arp.Client, ip netip.Addr, d time.Duration) (*arp.Packet, *ethernet.Frame) {
	tb.Helper()
	if err := c.Request(ip); err != nil {
		tb.Fatalf("ARP request: %v", err)
	}
	deadline := time.Now().Add(d)
	if err := c.SetReadDeadline(deadline); err != nil {
		tb.Fatal(err)
	}
	for {
		p, f, err := c.Read()
		if err != nil {
			if isTimeout(err) {
				return nil, nil
			}
			tb.Fatalf("ARP read: %v", err)
		}
		if p.Operation == arp.OperationReply && p.SenderIP == ip && p.TargetIP != ip {
			return p, f
		}
	}
}

// udpSocket opens a UDP socket in p's namespace.
func (l *lab) udpSocket(p labPeer, laddr *net.UDPAddr) *net.UDPConn {
	l.tb.Helper()
	var c *net.UDPConn
	l.check(inNamespace(p.ns, func() error {
		var err error
		c, err = net.ListenUDP("udp", laddr)
		return err
	}), "UDP socket")
	l.cleanup(func() { c.Close() })
	return c
}

// startEchoServers makes each node answer UDP datagrams to the VIPs with
// its name, so a test can tell which node it reached.
func (l *lab) startEchoServers() {
	for i, n := range append(l.nodes[:], l.nodes[:]...) {
		vip := labVIP
		if i >= len(l.nodes) {
			vip, i = labVIP6, i-len(l.nodes)
		}
		c := l.udpSocket(n, &net.UDPAddr{IP: net.IP(vip.AsSlice()), Port: labEchoPort})
		name := []byte(fmt.Sprintf("node%d", i+1))
		go func() {
			buf := make([]byte, 64)
			for {
				_, from, err := c.ReadFromUDP(buf)
				if err != nil {
					return
				}
				c.WriteToUDP(name, from)
			}
		}()
	}
}

// reach sends a datagram to the VIP through c and returns the name of the
// node that answered.
func reach(tb testing.TB, c *net.UDPConn) string {
	tb.Helper()
	return reachVIP(tb, c, labVIP)
}

// reachVIP is reach for either VIP.
func reachVIP(tb testing.TB, c *net.UDPConn, vip netip.Addr) string {
	tb.Helper()
	buf := make([]byte, 64)
	var lastErr error
	for range 5 {
		if _, err := c.WriteToUDP([]byte("who"), &net.UDPAddr{IP: net.IP(vip.AsSlice()), Port: labEchoPort}); err != nil {
			lastErr = err
			time.Sleep(200 * time.Millisecond)
			continue
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		n, _, err := c.ReadFromUDP(buf)
		if err == nil {
			return string(buf[:n])
		}
		lastErr = err
	}
	tb.Fatalf("VIP %s unreachable: %v", vip, lastErr)
	return ""
}

// neighbour returns the entry for ip in p's neighbour table on link.
func neighbour(tb testing.TB, p labPeer, linkName string, ip netip.Addr) (netlink.Neigh, bool) {
	tb.Helper()
	link, err := p.h.LinkByName(linkName)
	if err != nil {
		tb.Fatal(err)
	}
	family := netlink.FAMILY_V4
	if ip.Is6() {
		family = netlink.FAMILY_V6
	}
	list, err := p.h.NeighList(link.Attrs().Index, family)
	if err != nil {
		tb.Fatalf("neighbour list: %v", err)
	}
	for _, n := range list {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == ip {
			return n, true
		}
	}
	return netlink.Neigh{}, false
}

// waitFor polls cond every 5 ms for up to d and reports how long it took.
func waitFor(d time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > d {
			return time.Since(start), false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sniffer collects the gratuitous ARP a namespace sees.
type sniffer struct {
	c      *arp.Client
	frames chan sniffed
}

type sniffed struct {
	p  *arp.Packet
	f  *ethernet.Frame
	at time.Time
}

func (l *lab) sniff(p labPeer) *sniffer {
	s := &sniffer{c: l.arpClient(p), frames: make(chan sniffed, 1024)}
	go func() {
		for {
			pkt, f, err := s.c.Read()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			if pkt.SenderIP == pkt.TargetIP {
				select {
				case s.frames <- sniffed{pkt, f, time.Now()}:
				default:
				}
			}
		}
	}()
	return s
}

// await returns the first gratuitous frame for vip from mac with operation op
// within d.
func (s *sniffer) await(vip netip.Addr, mac net.HardwareAddr, op arp.Operation, d time.Duration) (sniffed, bool) {
	timeout := time.After(d)
	for {
		select {
		case f := <-s.frames:
			if f.p.SenderIP == vip && f.p.Operation == op && bytes.Equal(f.p.SenderHardwareAddr, mac) {
				return f, true
			}
		case <-timeout:
			return sniffed{}, false
		}
	}
}

func labOptions() Options {
	return Options{Count: 3, Interval: 200 * time.Millisecond, Refresh: -1, ProbeTimeout: 150 * time.Millisecond}
}

func TestNetnsClientReachesChosenNode(t *testing.T) {
	l := newLab(t, labOptions())
	l.startEchoServers()
	client := l.arpClient(l.client)

	// Nobody answers for the VIP before it is set: the nodes hold it on lo
	// with arp_ignore=1.
	if p, _ := ask(t, client, labVIP, 300*time.Millisecond); p != nil {
		t.Fatalf("before Set, %s answered for the VIP", p.SenderHardwareAddr)
	}

	l.check(l.a.Set(labVIP, labNodeMAC[0]), "Set")
	p, f := ask(t, client, labVIP, time.Second)
	if p == nil {
		t.Fatal("no answer for the VIP")
	}
	if !bytes.Equal(p.SenderHardwareAddr, labNodeMAC[0]) || !bytes.Equal(f.Source, labNodeMAC[0]) {
		t.Fatalf("answered with %s from %s, want node1's %s", p.SenderHardwareAddr, f.Source, labNodeMAC[0])
	}

	// The client's kernel resolves it the same way, and reaches node1.
	c := l.udpSocket(l.client, nil)
	if got := reach(t, c); got != "node1" {
		t.Fatalf("client reached %q, want node1", got)
	}
	n, ok := neighbour(t, l.client, "eth0", labVIP)
	if !ok || !bytes.Equal(n.HardwareAddr, labNodeMAC[0]) {
		t.Fatalf("client neighbour entry %+v, want %s", n, labNodeMAC[0])
	}

	// The host reaches it too, through its permanent neighbour entry.
	n, ok = neighbour(t, l.host, "br-lab", labVIP)
	if !ok || !bytes.Equal(n.HardwareAddr, labNodeMAC[0]) || n.State != netlink.NUD_PERMANENT {
		t.Fatalf("host neighbour entry %+v, want %s permanent", n, labNodeMAC[0])
	}
	if got := reach(t, l.udpSocket(l.host, nil)); got != "node1" {
		t.Fatalf("host reached %q, want node1", got)
	}
}

func TestNetnsMoveToNode2(t *testing.T) {
	l := newLab(t, labOptions())
	l.startEchoServers()
	c := l.udpSocket(l.client, nil)
	l.check(l.a.Set(labVIP, labNodeMAC[0]), "Set node1")
	if got := reach(t, c); got != "node1" {
		t.Fatalf("client reached %q, want node1", got)
	}
	n, _ := neighbour(t, l.client, "eth0", labVIP)
	t.Logf("client entry before the move: %s state %#x", n.HardwareAddr, n.State)

	// Node1's burst must be over, or its rounds would count as the move's.
	if _, ok := waitFor(3*time.Second, func() bool { return l.a.Stats().Gratuitous >= 6 }); !ok {
		t.Fatalf("node1's burst: %d frames", l.a.Stats().Gratuitous)
	}
	sniff := l.sniff(l.client)
	sent := l.a.Stats().Gratuitous
	start := time.Now()
	l.check(l.a.Set(labVIP, labNodeMAC[1]), "Set node2")

	req, ok := sniff.await(labVIP, labNodeMAC[1], arp.OperationRequest, 2*time.Second)
	if !ok {
		t.Fatal("no gratuitous request from node2 seen in the client namespace")
	}
	rep, ok := sniff.await(labVIP, labNodeMAC[1], arp.OperationReply, 2*time.Second)
	if !ok {
		t.Fatal("no gratuitous reply from node2 seen in the client namespace")
	}
	for _, f := range []sniffed{req, rep} {
		if !bytes.Equal(f.f.Source, labNodeMAC[1]) || !bytes.Equal(f.f.Destination, ethernet.Broadcast) {
			t.Errorf("%v: Ethernet %s -> %s, want %s -> broadcast", f.p.Operation, f.f.Source, f.f.Destination, labNodeMAC[1])
		}
	}
	t.Logf("first gratuitous frame on the client's wire %v after Set", req.at.Sub(start))

	took, ok := waitFor(3*time.Second, func() bool {
		n, ok := neighbour(t, l.client, "eth0", labVIP)
		return ok && bytes.Equal(n.HardwareAddr, labNodeMAC[1])
	})
	if !ok {
		n, _ := neighbour(t, l.client, "eth0", labVIP)
		t.Fatalf("client entry still %s after %v, want node2's %s", n.HardwareAddr, took, labNodeMAC[1])
	}
	t.Logf("client neighbour entry moved to node2 %v after Set", time.Since(start))
	if got := reach(t, c); got != "node2" {
		t.Fatalf("client reached %q after the move, want node2", got)
	}
	n, ok = neighbour(t, l.host, "br-lab", labVIP)
	if !ok || !bytes.Equal(n.HardwareAddr, labNodeMAC[1]) {
		t.Fatalf("host neighbour entry %+v, want node2's %s", n, labNodeMAC[1])
	}
	// Three rounds for the move.
	if _, ok := waitFor(2*time.Second, func() bool { return l.a.Stats().Gratuitous == sent+6 }); !ok {
		t.Errorf("%d gratuitous frames for the move, want 6", l.a.Stats().Gratuitous-sent)
	}
}

func TestNetnsRemove(t *testing.T) {
	l := newLab(t, labOptions())
	client := l.arpClient(l.client)
	l.check(l.a.Set(labVIP, labNodeMAC[0]), "Set")
	if _, ok := neighbour(t, l.host, "br-lab", labVIP); !ok {
		t.Fatal("no host neighbour entry after Set")
	}
	if p, _ := ask(t, client, labVIP, time.Second); p == nil {
		t.Fatal("no answer while set")
	}
	l.check(l.a.Remove(labVIP), "Remove")
	if n, ok := neighbour(t, l.host, "br-lab", labVIP); ok {
		t.Fatalf("host neighbour entry %+v still there after Remove", n)
	}
	if p, _ := ask(t, client, labVIP, 300*time.Millisecond); p != nil {
		t.Fatalf("%s answered for the VIP after Remove", p.SenderHardwareAddr)
	}
}

// TestNetnsAnswersOnlyOwnedVIPs: with a VIP set, requests for other unused
// addresses in the subnet (and the bridge's own) go unanswered by the
// announcer.
func TestNetnsAnswersOnlyOwnedVIPs(t *testing.T) {
	l := newLab(t, labOptions())
	client := l.arpClient(l.client)
	l.check(l.a.Set(labVIP, labNodeMAC[0]), "Set")
	for _, ip := range []netip.Addr{labUnowned, labFreeIP, labVIP.Next()} {
		if p, _ := ask(t, client, ip, 200*time.Millisecond); p != nil {
			t.Errorf("%s answered for unowned %s", p.SenderHardwareAddr, ip)
		}
	}
	// The host answers for its own address, itself, with the bridge MAC.
	p, _ := ask(t, client, netip.MustParseAddr("10.77.0.1"), time.Second)
	if p == nil || !bytes.Equal(p.SenderHardwareAddr, labBridgeMAC) {
		t.Errorf("bridge address answered by %+v, want the host with %s", p, labBridgeMAC)
	}
	if got := l.a.Stats().Replies; got != 0 {
		t.Errorf("Stats().Replies = %d, want 0", got)
	}
}

func TestNetnsProbe(t *testing.T) {
	// A rogue's reply may take longer than the 150 ms the other tests use
	// on a loaded host; what is checked here is the answer, not its speed.
	opts := labOptions()
	opts.ProbeTimeout = time.Second
	l := newLab(t, opts)
	ctx := context.Background()

	owner, taken, err := l.a.Probe(ctx, labRogueIP)
	if err != nil || !taken || !bytes.Equal(owner, labRogueMAC) {
		t.Fatalf("Probe(%s) = %s, %v, %v; want taken by the rogue's %s", labRogueIP, owner, taken, err, labRogueMAC)
	}
	if owner, taken, err := l.a.Probe(ctx, labFreeIP); err != nil || taken {
		t.Fatalf("Probe(%s) = %s, %v, %v; want free", labFreeIP, owner, taken, err)
	}
	// The nodes hold the VIP on lo but never answer ARP for it.
	if owner, taken, err := l.a.Probe(ctx, labVIP); err != nil || taken {
		t.Fatalf("Probe(%s) = %s, %v, %v; want free", labVIP, owner, taken, err)
	}

	// Many at once, one of them taken.
	var wg sync.WaitGroup
	start := time.Now()
	results := make([]bool, 16)
	for i := range results {
		wg.Go(func() {
			ip := labFreeIP
			if i == 0 {
				ip = labRogueIP
			} else {
				ip = netip.AddrFrom4([4]byte{10, 77, 0, byte(210 + i)})
			}
			_, taken, err := l.a.Probe(ctx, ip)
			if err != nil {
				t.Error(err)
			}
			results[i] = taken
		})
	}
	wg.Wait()
	if !results[0] {
		t.Error("concurrent Probe of the rogue's address: not taken")
	}
	for i, taken := range results[1:] {
		if taken {
			t.Errorf("concurrent Probe %d: taken", i+1)
		}
	}
	// Concurrent, not one after another (which would take 16 timeouts).
	if d := time.Since(start); d > 8*l.a.opts.ProbeTimeout {
		t.Errorf("16 concurrent probes took %v: serialized?", d)
	}
}

// TestNetnsLinkFlap: when the bridge goes down the kernel flushes the host
// neighbour entries and the socket errors; when it comes back everything is
// re-announced and re-installed, and requests are answered again.
func TestNetnsLinkFlap(t *testing.T) {
	l := newLab(t, labOptions())
	l.check(l.a.Set(labVIP, labNodeMAC[0]), "Set")
	if _, ok := waitFor(3*time.Second, func() bool { return l.a.Stats().Gratuitous >= 6 }); !ok {
		t.Fatalf("initial burst: %d frames", l.a.Stats().Gratuitous)
	}
	time.Sleep(l.a.opts.Interval)
	before := l.a.Stats().Gratuitous
	sniff := l.sniff(l.client)

	l.check(l.host.h.LinkSetDown(l.bridge), "bridge down")
	if _, ok := waitFor(time.Second, func() bool { _, ok := neighbour(t, l.host, "br-lab", labVIP); return !ok }); ok {
		t.Log("the kernel flushed the permanent neighbour entry with the link")
	}
	l.check(l.host.h.LinkSetUp(l.bridge), "bridge up")

	if _, ok := sniff.await(labVIP, labNodeMAC[0], arp.OperationRequest, 3*time.Second); !ok {
		t.Fatal("no gratuitous ARP seen after the bridge came back")
	}
	if _, ok := waitFor(3*time.Second, func() bool { return l.a.Stats().Gratuitous >= before+6 }); !ok {
		t.Errorf("re-announcement: %d frames, want %d", l.a.Stats().Gratuitous-before, 6)
	}
	if _, ok := waitFor(time.Second, func() bool {
		n, ok := neighbour(t, l.host, "br-lab", labVIP)
		return ok && bytes.Equal(n.HardwareAddr, labNodeMAC[0])
	}); !ok {
		t.Fatal("host neighbour entry not re-installed")
	}
	client := l.arpClient(l.client)
	if p, _ := ask(t, client, labVIP, time.Second); p == nil || !bytes.Equal(p.SenderHardwareAddr, labNodeMAC[0]) {
		t.Fatalf("after the flap, answer %+v, want %s", p, labNodeMAC[0])
	}
}

// TestNetnsRunLeavesNoGoroutines: with the real link watcher (rtnetlink), Run
// stops everything it started when its context ends.
func TestNetnsRunLeavesNoGoroutines(t *testing.T) {
	requireRoot(t)
	base := runtime.NumGoroutine()
	l := newLab(t, labOptions())
	l.check(l.a.Set(labVIP, labNodeMAC[0]), "Set")
	if _, _, err := l.a.Probe(context.Background(), labRogueIP); err != nil {
		t.Fatal(err)
	}
	l.check(l.host.h.LinkSetDown(l.bridge), "bridge down")
	l.check(l.host.h.LinkSetUp(l.bridge), "bridge up")
	time.Sleep(100 * time.Millisecond)
	l.stopRun()
	goroutinesBackTo(t, base)
}
