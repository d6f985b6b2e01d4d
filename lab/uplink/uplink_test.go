package uplink

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, veths, nftables")
	}
}

// newNS is a fresh network namespace with its loopback up; this
// goroutine's thread stays where it was.
func newNS(t *testing.T) netns.NsHandle {
	t.Helper()
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
	// A new namespace copies the host's IPv4 settings: forwarding is on
	// while a lab is up. Start from a fresh host's.
	fwdErr := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("0"), 0o644)
	if err := netns.Set(orig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	must(t, fwdErr)
	h := handle(t, ns)
	lo, _ := h.LinkByName("lo")
	must(t, h.LinkSetUp(lo))
	return ns
}

func handle(t *testing.T, ns netns.NsHandle) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// link makes a veth: name in a, peer in b, both up.
func link(t *testing.T, a netns.NsHandle, name string, b netns.NsHandle, peer string) {
	t.Helper()
	ha, hb := handle(t, a), handle(t, b)
	must(t, ha.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer, PeerNamespace: netlink.NsFd(b)}))
	for _, x := range []struct {
		h *netlink.Handle
		n string
	}{{ha, name}, {hb, peer}} {
		l, err := x.h.LinkByName(x.n)
		must(t, err)
		must(t, x.h.LinkSetUp(l))
	}
}

func addrs(t *testing.T, ns netns.NsHandle, dev string, prefixes ...string) {
	t.Helper()
	h := handle(t, ns)
	l, err := h.LinkByName(dev)
	must(t, err)
	for _, p := range prefixes {
		a := &netlink.Addr{IPNet: ipNet(netip.MustParsePrefix(p)), Flags: unix.IFA_F_NODAD}
		must(t, h.AddrAdd(l, a))
	}
}

func route(t *testing.T, ns netns.NsHandle, dst, via string) {
	t.Helper()
	must(t, handle(t, ns).RouteAdd(&netlink.Route{Dst: ipNet(netip.MustParsePrefix(dst)), Gw: net.ParseIP(via)}))
}

// serve answers every request in ns on addr with the client's address
// (who) or a fixed word.
func serve(t *testing.T, ns netns.NsHandle, addr, word string) {
	t.Helper()
	var ln net.Listener
	must(t, inNS(ns, func() (err error) { ln, err = net.Listen("tcp", addr); return err }))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if word == "who" {
			h, _, _ := net.SplitHostPort(r.RemoteAddr)
			io.WriteString(w, h)
			return
		}
		io.WriteString(w, word)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// get fetches url from ns, in at most 2 s.
func get(ns netns.NsHandle, url string) (string, error) {
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = inNS(ns, func() error { c, err = (&net.Dialer{}).DialContext(ctx, network, addr); return err })
		return c, err
	}}
	resp, err := (&http.Client{Transport: tr, Timeout: 2 * time.Second}).Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// testbed is a "host" with a default route to an "internet" (whose server
// 203.0.113.80 has no route to the lab), a "lab" with a bridge, and a
// "guest" on it with a pod-like address the lab routes to it.
type testbed struct{ host, internet, lab, guest netns.NsHandle }

func newTestbed(t *testing.T) testbed {
	b := testbed{host: newNS(t), internet: newNS(t), lab: newNS(t), guest: newNS(t)}
	link(t, b.host, "eth0", b.internet, "eth0")
	addrs(t, b.host, "eth0", "198.51.100.2/24", "2001:db8::2/64")
	addrs(t, b.internet, "eth0", "198.51.100.1/24")
	addrs(t, b.internet, "lo", "203.0.113.80/32")
	route(t, b.host, "0.0.0.0/0", "198.51.100.1")
	route(t, b.internet, "10.244.0.0/16", "198.51.100.2") // a peer trying the host as a way in
	serve(t, b.internet, "203.0.113.80:80", "who")

	lab := handle(t, b.lab)
	must(t, lab.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "lcbr0"}}))
	br, err := lab.LinkByName("lcbr0")
	must(t, err)
	must(t, lab.LinkSetUp(br))
	addrs(t, b.lab, "lcbr0", "10.123.0.1/24", "fd00:10:123::1/64")
	link(t, b.lab, "vnet0", b.guest, "eth0")
	port, err := lab.LinkByName("vnet0")
	must(t, err)
	must(t, lab.LinkSetMaster(port, br))
	addrs(t, b.guest, "eth0", "10.123.0.100/24", "fd00:10:123::100/64")
	addrs(t, b.guest, "lo", "10.244.1.5/32", "fd00:10:244:1::5/128")
	route(t, b.guest, "0.0.0.0/0", "10.123.0.1")
	route(t, b.guest, "::/0", "fd00:10:123::1")
	route(t, b.lab, "10.244.1.0/24", "10.123.0.100")
	route(t, b.lab, "fd00:10:244:1::/64", "fd00:10:123::100")
	serve(t, b.guest, "[::]:80", "guest")
	return b
}

var testPlan = Plan{IPv6: true, Prefixes: []Named{
	{What: "network", Prefix: netip.MustParsePrefix("10.123.0.0/24")},
	{What: "pod CIDRs", Prefix: netip.MustParsePrefix("10.244.0.0/16")},
	{What: "IPv6 network", Prefix: netip.MustParsePrefix("fd00:10:123::/64")},
	{What: "IPv6 pod CIDRs", Prefix: netip.MustParsePrefix("fd00:10:244::/56")},
}}

// reach checks the uplink end to end: the guest reaches the internet's
// server through NAT (which sees the host's address), and the host
// reaches the guest's and its pod-like addresses in both families.
func (b testbed) reach(t *testing.T) {
	t.Helper()
	got, err := get(b.guest, "http://203.0.113.80/")
	if err != nil || got != "198.51.100.2" {
		t.Errorf("the guest fetching from the internet: %q, %v; want the host's address 198.51.100.2 (NAT)", got, err)
	}
	for _, u := range []string{"http://10.123.0.100/", "http://10.244.1.5/", "http://[fd00:10:123::100]/", "http://[fd00:10:244:1::5]/"} {
		if got, err := get(b.host, u); err != nil || got != "guest" {
			t.Errorf("the host fetching %s: %q, %v; want guest", u, got, err)
		}
	}
	// A LAN peer that routes the lab's addresses via the host gets no
	// way in: the host forwards for the lab, never into it.
	if got, err := get(b.internet, "http://10.244.1.5/"); err == nil {
		t.Errorf("the internet, routing the lab via the host, fetched from a pod: %q", got)
	}
}

func sysctl(t *testing.T, ns netns.NsHandle, key string) string {
	t.Helper()
	var v string
	must(t, inNS(ns, func() error {
		b, err := os.ReadFile("/proc/sys/" + key)
		v = strings.TrimSpace(string(b))
		return err
	}))
	return v
}

// dockerLike gives ns what Docker gives a host: iptables-nft's
// ip filter FORWARD with policy drop, jumping first to DOCKER-USER.
func dockerLike(t *testing.T, ns netns.NsHandle) (*nftables.Table, *nftables.Chain, *nftables.Chain) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	must(t, err)
	drop := nftables.ChainPolicyDrop
	tab := c.AddTable(&nftables.Table{Name: "filter", Family: nftables.TableFamilyIPv4})
	fwd := c.AddChain(&nftables.Chain{Name: "FORWARD", Table: tab, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	user := c.AddChain(&nftables.Chain{Name: dockerUser, Table: tab})
	c.AddRule(&nftables.Rule{Table: tab, Chain: fwd, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: dockerUser}}})
	must(t, c.Flush())
	return tab, fwd, user
}

func rules(t *testing.T, ns netns.NsHandle, tab *nftables.Table, ch *nftables.Chain) int {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	must(t, err)
	rs, err := c.GetRules(tab, ch)
	must(t, err)
	return len(rs)
}

// removed checks that Remove left nothing of the uplink in the host.
func (b testbed) removed(t *testing.T) {
	t.Helper()
	h := handle(t, b.host)
	if _, err := h.LinkByName(HostLink); err == nil {
		t.Errorf("%s still exists", HostLink)
	}
	if rs, err := ours(h); err != nil || len(rs) > 0 {
		t.Errorf("routes of protocol %d left: %v %v", Protocol, rs, err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(b.host)))
	must(t, err)
	if _, err := c.ListTableOfFamily(Table, nftables.TableFamilyINet); err == nil {
		t.Errorf("table inet %s still exists", Table)
	}
	if v := sysctl(t, b.host, "net/ipv4/ip_forward"); v != "0" {
		t.Errorf("ip_forward %s after Remove, want 0 as it was", v)
	}
}

func TestUplink(t *testing.T) {
	needRoot(t)
	b := newTestbed(t)
	if _, err := get(b.guest, "http://203.0.113.80/"); err == nil {
		t.Fatal("the guest reaches the internet before any uplink: the test proves nothing")
	}
	must(t, Check(b.host, testPlan))
	m, err := Setup(b.host, b.lab, testPlan)
	must(t, err)
	if !m.Record.TurnedOnForwarding || sysctl(t, b.host, "net/ipv4/ip_forward") != "1" {
		t.Errorf("Setup: forwarding %s, record %+v; want it on and recorded", sysctl(t, b.host, "net/ipv4/ip_forward"), m.Record)
	}
	if sysctl(t, b.host, "net/ipv6/conf/all/forwarding") != "0" {
		t.Error("Setup turned on IPv6 forwarding in the host's namespace")
	}
	b.reach(t)
	// Our own routes are no clash for the next up.
	must(t, Check(b.host, testPlan))

	// Docker arrives: its FORWARD drops what our table accepted.
	tab, fwd, user := dockerLike(t, b.host)
	if _, err := get(b.guest, "http://203.0.113.80/"); err == nil {
		t.Fatal("the guest reaches out through a FORWARD chain that drops: the test proves nothing")
	}
	must(t, Remove(b.host, m.Record))
	b.removed(t)
	m, err = Setup(b.host, b.lab, testPlan)
	must(t, err)
	if n := rules(t, b.host, tab, user); n != 2 {
		t.Errorf("DOCKER-USER has %d rules, want our 2 accepts", n)
	}
	b.reach(t)
	// Docker's iptables-nft must still read the chain our rules are in.
	if _, err := exec.LookPath("iptables-nft"); err == nil {
		var out []byte
		must(t, inNS(b.host, func() (err error) {
			out, err = exec.Command("iptables-nft", "-S", dockerUser).CombinedOutput()
			return err
		}))
		if !strings.Contains(string(out), "-i "+HostLink) || !strings.Contains(string(out), Tag) {
			t.Errorf("iptables-nft -S %s:\n%s\nwant our tagged accepts", dockerUser, out)
		}
	}
	must(t, Remove(b.host, m.Record))
	b.removed(t)
	if n, m := rules(t, b.host, tab, user), rules(t, b.host, tab, fwd); n != 0 || m != 1 {
		t.Errorf("after Remove DOCKER-USER has %d rules (want 0), FORWARD %d (want Docker's 1)", n, m)
	}
}

// A lab that crashed leaves its table, tagged rules and routes with no
// record: Remove finds them by name.
func TestRemoveWithoutRecord(t *testing.T) {
	needRoot(t)
	b := newTestbed(t)
	tab, _, user := dockerLike(t, b.host)
	_, err := Setup(b.host, b.lab, testPlan)
	must(t, err)
	must(t, Remove(b.host, Record{}))
	h := handle(t, b.host)
	if _, err := h.LinkByName(HostLink); err == nil {
		t.Errorf("%s still exists", HostLink)
	}
	if rs, err := ours(h); err != nil || len(rs) > 0 {
		t.Errorf("routes of protocol %d left: %v %v", Protocol, rs, err)
	}
	if n := rules(t, b.host, tab, user); n != 0 {
		t.Errorf("DOCKER-USER has %d rules left", n)
	}
}

func TestCheckRefusesAHostRoute(t *testing.T) {
	needRoot(t)
	host := newNS(t)
	link(t, host, "cni0", newNS(t), "eth0")
	addrs(t, host, "cni0", "10.244.0.1/16")
	err := Check(host, testPlan)
	var ce *ClashError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "the lab's pod CIDRs 10.244.0.0/16 and the host's route 10.244.0.0/16 dev cni0 overlap") {
		t.Errorf("Check: %v; want a clash naming the pod CIDRs and cni0's route", err)
	}
}
