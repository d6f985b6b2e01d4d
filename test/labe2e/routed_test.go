package labe2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/labcloud/labcloud/lab"
)

// TestLabHostsRouted: a lab of two hosts on segments of their own (up
// --routed), each host its guests' gateway and the router between them.
// Every Node's network is available (the leader leaves the other host's
// pod CIDRs to it); the router routes every pod CIDR and the VIP, each via
// its node, learned over BGP; the VIP, on no host's segment, is answered
// through the router by pods on both hosts; pods reach each other across
// hosts; the answering node's domain destroyed, the router routes the VIP
// via the other host's node.
func TestLabHostsRouted(t *testing.T) {
	l := newLabcloud(t)
	st := l.up("--hosts", "2", "--nodes", "2", "--routed")
	hosts := st.LabHosts()
	hostOf, internalIPs := l.nodeHosts()
	ipOf := map[string]string{} // node -> its InternalIP (IPv4 only)
	for name, ips := range internalIPs {
		ipOf[name] = ips[0]
	}
	for _, h := range hosts {
		subnet := strings.TrimSuffix(h.Address, "1")
		for node, on := range hostOf {
			if on == h.Name && !strings.HasPrefix(ipOf[node], subnet) {
				t.Errorf("node %s on %s has InternalIP %s, want one on the host's subnet %s0/24", node, h.Name, ipOf[node], subnet)
			}
		}
	}
	if len(hostOf) != 2 || hostOf["lab-node-1"] == hostOf["lab-node-2"] {
		t.Fatalf("nodes on hosts %v, want one on each", hostOf)
	}
	unavailable := l.mustKubectl("get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="NetworkUnavailable")].status} {end}`)
	for _, nc := range strings.Fields(unavailable) {
		if name, status, _ := strings.Cut(nc, "="); status != "False" {
			t.Errorf("node %s: NetworkUnavailable %q, want False", name, status)
		}
	}
	eventually(t, "the router's route to every pod CIDR via its node", 90*time.Second, time.Second, func() string {
		for _, n := range l.status().Nodes {
			// One pod CIDR: the route is "via NODE[,RESOLVED-VIA]".
			if len(n.PodCIDRs) != 1 || !strings.HasPrefix(n.RouterRoute, "via "+ipOf[n.Name]) {
				return fmt.Sprintf("node %s (%s): pod CIDRs %v, the router's routes %q", n.Name, n.Host, n.PodCIDRs, n.RouterRoute)
			}
		}
		return ""
	})

	l.apply(netexec("web", 4, "") + "---\n" + loadBalancer("web", false))
	l.mustKubectl("rollout", "status", "deployment/web", "--timeout=5m")
	podNode, podIP := l.podsOf("web")
	vip, node := "", ""
	eventually(t, "the VIP in the router's RIB via the node answering it", 2*time.Minute, 500*time.Millisecond, func() string {
		if vip, node = l.announcer("default/web"); vip == "" || node == "" {
			return "no VIP or node in status"
		}
		rib, err := l.run(30*time.Second, "router", "--", "show ip route "+vip+"/32")
		// FRR: the BGP next hop, "(recursive)", then the hop it resolves to.
		if err != nil || !strings.Contains(rib, `Known via "bgp"`) || !strings.Contains(rib, ipOf[node]+" (recursive)") {
			return fmt.Sprintf("the router's route to %s: %q %v, want via %s (%s)", vip, rib, err, node, ipOf[node])
		}
		return ""
	})
	answeredFrom := map[string]bool{}
	eventually(t, "VIP "+vip+" answered through the router by pods on both hosts", 2*time.Minute, 250*time.Millisecond, func() string {
		got, err := l.curl("http://" + vip + "/hostname")
		if n, ok := podNode[got]; err == nil && ok {
			answeredFrom[hostOf[n]] = true
		}
		if len(answeredFrom) < 2 {
			return fmt.Sprintf("answered from hosts %v so far (last %q %v)", answeredFrom, got, err)
		}
		return ""
	})

	// Pod to pod across hosts, both ways, through the router.
	podOn := map[string]string{}
	for p, n := range podNode {
		podOn[hostOf[n]] = p
	}
	for _, pair := range [][2]string{{hosts[0].Name, hosts[1].Name}, {hosts[1].Name, hosts[0].Name}} {
		a, b := podOn[pair[0]], podOn[pair[1]]
		url := "http://" + podIP[b] + ":8080/hostname"
		got, err := l.kubectl(time.Minute, "exec", a, "--", "wget", "-qO-", "-T", "5", url)
		if strings.TrimSpace(got) != b {
			t.Errorf("pod %s on %s fetched pod %s on %s at %s: %q %v", a, pair[0], b, pair[1], url, got, err)
		}
	}
	t.Logf("routed: VIP %s via %s in the router's RIB, answered by pods on both hosts", vip, node)

	// The answering node's domain destroyed: the router routes the VIP via
	// the other node, announced by the other host's replica.
	other := "lab-node-1"
	if node == other {
		other = "lab-node-2"
	}
	destroyed := time.Now()
	if err := lab.NodeAction(st, node, "stop"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the router's route to "+vip+" via "+other, time.Minute, 50*time.Millisecond, func() string {
		rib, err := l.run(30*time.Second, "router", "--", "show ip route "+vip+"/32")
		if err != nil || !strings.Contains(rib, ipOf[other]+" (recursive)") {
			return fmt.Sprintf("%q %v", rib, err)
		}
		return ""
	})
	t.Logf("the router routed %s via %s %s after %s's domain was destroyed (libvirt's destroy path included)", vip, other, time.Since(destroyed).Round(time.Millisecond), node)
}
