package labe2e

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestLabMoved brings a lab up on a host that already routes the lab's
// default prefixes (as a homelab with flannel does): up with the defaults
// refuses, naming both clashes and the flags that move them; with
// --subnet and --pod-cidr the lab comes up there, its node's address,
// pod CIDR and a LoadBalancer VIP in the moved ranges, the VIP answering
// the host; down leaves no route to either.
func TestLabMoved(t *testing.T) {
	// A lab of its own, not CI's budget: the flags' decisions are unit
	// tested (lab, lab/uplink); this proves them on a lab.
	if os.Getenv("LABCLOUD_LAB_MOVED") == "" {
		t.Skip("make conformance runs it (its run moved, LABCLOUD_LAB_MOVED=1): a lab of its own does not fit make test's budget")
	}
	l := newLabcloud(t)
	// A bridge stands for the host's own interface (not every kernel
	// here has the dummy driver).
	const dummy = "lcmove0"
	for _, args := range [][]string{
		{"link", "add", dummy, "type", "bridge"},
		{"link", "set", dummy, "up"},
		{"route", "add", "10.123.0.0/24", "dev", dummy},
		{"route", "add", "10.244.0.0/16", "dev", dummy},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", dummy).Run() })

	out, err := l.run(10*time.Minute, "up", "--nodes", "1")
	if err == nil {
		t.Fatalf("up with the defaults on a host routing them came up:\n%s", out)
	}
	for _, want := range []string{"network 10.123.0.0/24 and the host's route 10.123.0.0/24 dev " + dummy, "--subnet moves",
		"pod CIDRs 10.244.0.0/16 and the host's route 10.244.0.0/16 dev " + dummy, "--pod-cidr moves"} {
		if !strings.Contains(out, want) {
			t.Errorf("up's refusal lacks %q:\n%s", want, out)
		}
	}

	st := l.up("--nodes", "1", "--subnet", "10.77.0.0/24", "--pod-cidr", "10.78.0.0/16")
	if got := st.Addressing.Network().String() + " " + st.Addressing.ClusterCIDR(); got != "10.77.0.0/24 10.78.0.0/16" {
		t.Errorf("state's addressing %s, want 10.77.0.0/24 10.78.0.0/16", got)
	}
	inRange := func(s, from, to string) bool {
		a, err := netip.ParseAddr(s)
		return err == nil && netip.MustParseAddr(from).Compare(a) <= 0 && a.Compare(netip.MustParseAddr(to)) <= 0
	}
	s := l.status()
	if len(s.Nodes) != 1 {
		t.Fatalf("status shows %d nodes, want 1: %+v", len(s.Nodes), s.Nodes)
	}
	n := s.Nodes[0]
	internal := ""
	for _, a := range n.Addresses {
		if ip, ok := strings.CutPrefix(a, "InternalIP="); ok {
			internal = ip
		}
	}
	if !inRange(internal, "10.77.0.100", "10.77.0.199") {
		t.Errorf("node %s's InternalIP %q, want one of the moved DHCP range 10.77.0.100-199: %v", n.Name, internal, n.Addresses)
	}
	if p, err := netip.ParsePrefix(n.PodCIDR); err != nil || !netip.MustParsePrefix("10.78.0.0/16").Contains(p.Addr()) {
		t.Errorf("node %s's pod CIDR %q, want one in 10.78.0.0/16", n.Name, n.PodCIDR)
	}

	l.apply(netexec("moved", 1, "") + "---\n" + loadBalancer("moved", false))
	var vip string
	eventually(t, "a VIP in the moved pool answering the host", 3*time.Minute, 2*time.Second, func() string {
		if vip, _ = l.announcer("default/moved"); vip == "" {
			return "no VIP yet"
		}
		if !inRange(vip, "10.77.0.200", "10.77.0.250") {
			return fmt.Sprintf("VIP %s, want one of the moved pool 10.77.0.200-250", vip)
		}
		if got, err := hostGet("http://" + vip + "/hostname"); err != nil || !strings.HasPrefix(got, "moved-") {
			return fmt.Sprintf("GET http://%s/hostname from the host: %q %v", vip, got, err)
		}
		return ""
	})
	if t.Failed() {
		return
	}

	l.must(5*time.Minute, "down")
	checkUplinkGone(t)
	for _, p := range []string{"10.77.0.0/24", "10.78.0.0/16", vip} {
		if out, _ := exec.Command("ip", "route", "show", "match", p).Output(); strings.Contains(string(out), "10.77.") || strings.Contains(string(out), "10.78.") {
			t.Errorf("a route to %s left behind by down: %s", p, out)
		}
	}
}
