package announce

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/labcloud/labcloud/examples"
)

// sandboxChildEnv names the bridge a re-executed test binary announces on.
const sandboxChildEnv = "LABCLOUD_ANNOUNCE_SANDBOX_BRIDGE"

// TestRunsInTheUnitsSandbox runs an Announcer as an installed CCM runs it:
// in a process confined as the shipped systemd unit confines the CCM (its
// capability bounding set, no new privileges), started inside the
// bridge's network namespace. It must keep running, install the VIPs'
// neighbour entries, send gratuitous ARP and unsolicited Neighbor
// Advertisements, join the IPv6 VIP's group and hear frames for others.
func TestRunsInTheUnitsSandbox(t *testing.T) {
	if bridge := os.Getenv(sandboxChildEnv); bridge != "" {
		announceInSandbox(t, bridge)
		return
	}
	sandbox, ns := sandboxNetns(t, "lc-sandbox")
	run(t, "ip", "-n", ns, "link", "add", "br-sb", "address", "02:78:00:00:00:01", "type", "bridge")
	run(t, "ip", "-n", ns, "addr", "add", "10.78.0.1/24", "dev", "br-sb")
	run(t, "ip", "-n", ns, "addr", "add", "fd78::1/64", "dev", "br-sb", "nodad")
	run(t, "ip", "-n", ns, "link", "set", "br-sb", "up")

	argv := sandbox.Wrap([]string{os.Args[0], "-test.run=^TestRunsInTheUnitsSandbox$", "-test.v"})
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Env = append(os.Environ(), sandboxChildEnv+"=br-sb")
	out, err := cmd.CombinedOutput()
	t.Logf("confined as %s:\n%s", strings.Join(argv[:len(argv)-3], " "), out)
	if err != nil {
		t.Fatalf("the announcer failed under the unit's sandbox: %v", err)
	}
	if !strings.Contains(string(out), "announced in the sandbox") {
		t.Fatal("the confined process did not report its announcement")
	}
	neigh := run(t, "ip", "-n", ns, "neigh", "show", "dev", "br-sb", "nud", "permanent")
	for _, want := range []string{"10.78.0.100 lladdr 02:78:00:00:00:11", "fd78::100 lladdr 02:78:00:00:00:11"} {
		if !strings.Contains(neigh, want) {
			t.Fatalf("no permanent neighbour entry %q after the confined run:\n%s", want, neigh)
		}
	}
}

// announceInSandbox is the confined half: it checks that it holds no more
// than the unit grants, then announces a VIP for 1.5 s.
func announceInSandbox(t *testing.T, bridge string) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok && strings.TrimSpace(v) != "0000000000003000" {
			t.Fatalf("effective capabilities %s, want CAP_NET_ADMIN and CAP_NET_RAW only (3000)", strings.TrimSpace(v))
		}
		if v, ok := strings.CutPrefix(line, "NoNewPrivs:"); ok && strings.TrimSpace(v) != "1" {
			t.Fatal("no_new_privs is not set")
		}
	}
	ifi, err := net.InterfaceByName(bridge)
	if err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	a, err := New(ifi, h, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- a.Run(ctx) }()
	for _, vip := range []string{"10.78.0.100", "fd78::100"} {
		if err := a.Set(netip.MustParseAddr(vip), mustMAC("02:78:00:00:00:11")); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(readFile(t, "/proc/net/igmp6"), "ff0200000000000000000001ff000100") {
		t.Errorf("the IPv6 VIP's solicited-node group is not joined:\n%s", readFile(t, "/proc/net/igmp6"))
	}
	if link, err := h.LinkByName(bridge); err != nil || link.Attrs().Promisc == 0 {
		t.Errorf("the bridge is not promiscuous with an IPv6 VIP owned (%v)", err)
	}
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if s := a.Stats(); s.Gratuitous == 0 || s.Advertisements == 0 || s.WriteErrors > 0 {
		t.Fatalf("stats %+v: want gratuitous ARP and advertisements written without errors", s)
	}
	t.Log("announced in the sandbox")
}

// sandboxNetns skips unless root, and returns the unit's sandbox and a new
// network namespace, deleted at cleanup.
func sandboxNetns(t *testing.T, prefix string) (examples.Sandbox, string) {
	t.Helper()
	requireRoot(t)
	sandbox, err := examples.CCMSandbox()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Fatalf("setpriv (util-linux) is needed to start a process confined as the unit: %v", err)
	}
	ns := fmt.Sprintf("%s-%d", prefix, os.Getpid())
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	return sandbox, ns
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}
