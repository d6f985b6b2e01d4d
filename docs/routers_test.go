package docs

// The router's side that docs/bgp.md shows, checked against what runs it:
// the FRR configuration against the one the tests' FRR runs with and
// against FRR's own parser, the firewall rules against the kernel.

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/labcloud/labcloud/internal/frr"
	"github.com/labcloud/labcloud/internal/nstest"
)

// codeBlocks are the contents of md's fenced code blocks.
func codeBlocks(md string) []string {
	all, prose := lines(md)
	var out []string
	var cur []string
	for i, l := range all {
		switch {
		case isFence(l) && !prose[i] && cur == nil:
			cur = []string{}
		case isFence(l):
			out = append(out, strings.Join(cur, "\n"))
			cur = nil
		case cur != nil:
			cur = append(cur, l)
		}
	}
	return out
}

// onlyBlock is the one code block of a section of docs/bgp.md.
func onlyBlock(t *testing.T, title string) string {
	t.Helper()
	blocks := codeBlocks(section(t, readDoc(t, "docs/bgp.md"), title))
	if len(blocks) != 1 {
		t.Fatalf("docs/bgp.md, %s: %d code blocks, want 1", title, len(blocks))
	}
	return blocks[0]
}

var (
	frrRouterBGP = regexp.MustCompile(`(?m)^router bgp (\d+)$`)
	frrRouterID  = regexp.MustCompile(`(?m)^ bgp router-id (\S+)$`)
	frrNeighbor  = regexp.MustCompile(`(?m)^ neighbor (\S+) remote-as (\d+)$`)
)

// labOnly are lines of internal/frr's configuration that serve the tests,
// not a router: FRR retries its own connection to the CCM, which never
// listens, every second instead of every 120 s.
var labOnly = regexp.MustCompile(`^ neighbor \S+ timers connect \d+$`)

// TestFRRExample: bgp.md's FRR configuration holds, in order, every line of
// the one internal/frr writes for the same router and neighbours (the
// configuration the bgp and e2e tests run FRR with, the CCM's speaker
// peering), and FRR's parser takes the whole of it.
func TestFRRExample(t *testing.T) {
	doc := onlyBlock(t, "FRR")
	cfg := frr.Config{}
	m := frrRouterBGP.FindStringSubmatch(doc)
	id := frrRouterID.FindStringSubmatch(doc)
	if m == nil || id == nil {
		t.Fatalf("docs/bgp.md's FRR configuration has no `router bgp ASN` or `bgp router-id`:\n%s", doc)
	}
	cfg.ASN = parseASN(t, m[1])
	cfg.RouterID = netip.MustParseAddr(id[1])
	for _, n := range frrNeighbor.FindAllStringSubmatch(doc, -1) {
		has := func(what string) bool { return strings.Contains(doc, "\n neighbor "+n[1]+" "+what) }
		nb := frr.Neighbor{Address: netip.MustParseAddr(n[1]), ASN: parseASN(t, n[2]),
			BFD: has("bfd profile labcloud"), NextHopsAnywhere: has("disable-connected-check")}
		if pw := regexp.MustCompile(`\n neighbor ` + regexp.QuoteMeta(n[1]) + ` password (\S+)`).FindStringSubmatch(doc); pw != nil {
			nb.Password = pw[1]
		}
		cfg.Neighbors = append(cfg.Neighbors, nb)
	}
	if len(cfg.Neighbors) == 0 {
		t.Fatal("docs/bgp.md's FRR configuration has no neighbour")
	}
	files := cfg.Files()
	bgpd := strings.Split(strings.TrimSuffix(files["bgpd"], "\n"), "\n")
	// One file for every daemon (Debian's frr.conf): the defaults first.
	want := append(bgpd[:1:1], strings.Split(strings.TrimSuffix(files["bfdd"], "\n"), "\n")...)
	want = append(want, bgpd[1:]...)
	want = slices.DeleteFunc(want, labOnly.MatchString)
	if missing := notInOrder(want, strings.Split(doc, "\n")); missing != "" {
		t.Errorf("docs/bgp.md's FRR configuration lacks, or misplaces, %q of the configuration the tests run FRR with:\n%s", missing, strings.Join(want, "\n"))
	}

	vtysh, err := exec.LookPath("vtysh")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skipf("needs FRR's vtysh: %v", err)
	}
	file := filepath.Join(t.TempDir(), "frr.conf")
	if err := os.WriteFile(file, []byte(doc+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(vtysh, "--dryrun", "--inputfile", file).CombinedOutput(); err != nil {
		t.Errorf("FRR refuses docs/bgp.md's configuration: %v\n%s", err, out)
	}
}

func parseASN(t *testing.T, s string) uint32 {
	t.Helper()
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(n)
}

// notInOrder is the first line of want that does not follow the previous
// one in have, or "" when want is a subsequence of have.
func notInOrder(want, have []string) string {
	i := 0
	for _, w := range want {
		j := slices.Index(have[i:], w)
		if j < 0 {
			return w
		}
		i += j + 1
	}
	return ""
}

// applyRules runs the iptables commands of a block in the named network
// namespace; each must succeed.
func applyRules(t *testing.T, ns, block string) {
	t.Helper()
	n := 0
	for _, l := range strings.Split(block, "\n") {
		for _, words := range simpleCommands(l) {
			if p, _ := program(words); p != "iptables" && p != "ip6tables" {
				t.Fatalf("docs/bgp.md: %q is not an iptables command", l)
			}
			n++
			if out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, words...)...).CombinedOutput(); err != nil {
				t.Errorf("docs/bgp.md: %s: %v\n%s", l, err, out)
			}
		}
	}
	if n == 0 {
		t.Fatal("docs/bgp.md: no iptables command in the block")
	}
}

// TestFirewallExamples: bgp.md's firewall rules load, and the host's let
// BFD in from the router with TTL 255 only.
func TestFirewallExamples(t *testing.T) {
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skipf("needs iptables: %v", err)
	}
	blocks := codeBlocks(section(t, readDoc(t, "docs/bgp.md"), "Firewalls"))
	if len(blocks) != 2 {
		t.Fatalf("docs/bgp.md, Firewalls: %d code blocks, want the host's and the router's", len(blocks))
	}
	hostRules, routerRules := blocks[0], blocks[1]

	router := nstest.Named(t, "lc-doc-router")
	applyRules(t, router, routerRules)

	host := nstest.Named(t, "lc-doc-host")
	applyRules(t, host, hostRules)
	// The router's address, and another machine's on the same LAN.
	nstest.Link(t, router, "lan0", []string{"192.168.1.1/24", "192.168.1.2/24"}, host, "lan0", []string{"192.168.1.10/24"})
	var bfd net.PacketConn
	nstest.InNamed(t, host, func() {
		var err error
		if bfd, err = net.ListenPacket("udp4", ":3784"); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { bfd.Close() })

	sends := []struct {
		from string
		ttl  int
		pass bool
	}{{"192.168.1.1", 255, true}, {"192.168.1.1", 64, false}, {"192.168.1.2", 255, false}}
	nstest.InNamed(t, router, func() {
		for _, s := range sends {
			sendBFD(t, s.from, s.ttl)
		}
	})
	got := map[string]bool{}
	buf := make([]byte, 64)
	for {
		if err := bfd.SetReadDeadline(time.Now().Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		n, _, err := bfd.ReadFrom(buf)
		if err != nil {
			break
		}
		got[string(buf[:n])] = true
	}
	for _, s := range sends {
		if key := fmt.Sprintf("%s ttl %d", s.from, s.ttl); got[key] != s.pass {
			t.Errorf("docs/bgp.md's host rules: BFD from %s: passed %v, want %v", key, got[key], s.pass)
		}
	}
}

// sendBFD sends a datagram to the host's BFD port from the address, with the TTL.
func sendBFD(t *testing.T, from string, ttl int) {
	t.Helper()
	c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP(from)}, &net.UDPAddr{IP: net.ParseIP("192.168.1.10"), Port: 3784})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_TTL, ttl) }); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	if _, err := fmt.Fprintf(c, "%s ttl %d", from, ttl); err != nil {
		t.Fatal(err)
	}
}
