package labe2e

import (
	"fmt"
	"maps"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/labcloud/labcloud/lab"
)

// TestLabHosts: a dual-stack lab of two hypervisor hosts, one guest each,
// their bridges on one LAN with the FRR router. The first host's CCM, in
// the unit's sandbox, reaches the second host's libvirtd over ssh (its own
// ssh client, to the sshd in that host's namespace). Each host's replica peers with
// the router, which learns every pod CIDR via its node, and routes its own
// bridge; one VIP is answered by pods on both hosts; a VIP placed on the
// second host's node is answered by that host's replica with the leader
// stopped; pods reach each other across hosts through the router; losing a
// whole host's guests keeps the VIP answered and deletes no Node; down
// removes every host.
func TestLabHosts(t *testing.T) {
	l := newLabcloud(t)
	st := l.up("--hosts", "2", "--nodes", "2", "--ip-family", "dual")
	hosts := st.LabHosts()
	if len(hosts) != 2 {
		t.Fatalf("state has hosts %+v, want 2", hosts)
	}

	hostOf, internalIPs := l.nodeHosts() // node -> host, its InternalIPs (IPv4 first)
	for name := range hostOf {
		if len(internalIPs[name]) != 2 {
			t.Errorf("node %s: InternalIPs %v, want one of each family", name, internalIPs[name])
		}
	}
	zones := l.mustKubectl("get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.metadata.labels.topology\.kubernetes\.io/zone}{" "}{end}`)
	for _, nz := range strings.Fields(zones) {
		name, zone, _ := strings.Cut(nz, "=")
		if zone != hostOf[name] {
			t.Errorf("node %s: zone %q, host %q; want the zone of its host", name, zone, hostOf[name])
		}
	}
	if len(hostOf) != 2 || hostOf["lab-node-1"] == hostOf["lab-node-2"] {
		t.Fatalf("nodes on hosts %v, want one on each", hostOf)
	}

	// The leader, the first host's CCM (checked below), found the second
	// host's node, zone and all, over ssh: its URI for that host is
	// qemu+ssh:// with the key and known_hosts up made as
	// docs/several-hosts.md says, and it holds a connection to that host's
	// sshd.
	if want := "qemu+ssh://root@" + hosts[1].Address + "/system?keyfile="; !strings.HasPrefix(hosts[1].SSHURI, want) {
		t.Errorf("the first host's CCM reaches %s at %q, want %s...", hosts[1].Name, hosts[1].SSHURI, want)
	}
	eventually(t, "the first host's CCM connected to "+hosts[1].Name+"'s sshd", 30*time.Second, time.Second, func() string {
		out, err := exec.Command("ip", "netns", "exec", st.Netns, "ss", "-tnpH", "state", "established", "dst", hosts[1].Address, "dport", "=", ":22").CombinedOutput()
		if want := fmt.Sprintf("pid=%d,", st.Pids[lab.CCMProcess]); err != nil || !strings.Contains(string(out), want) {
			return fmt.Sprintf("ss: %q %v, want a connection of the CCM's (%s)", strings.TrimSpace(string(out)), err, want)
		}
		return ""
	})

	// Each replica peers with the router; the router routes every pod CIDR
	// to its node.
	eventually(t, "the router's sessions with both replicas and a route to every pod CIDR", 90*time.Second, time.Second, func() string {
		s := l.status()
		if s.Router == nil || len(s.Router.Sessions) != 2 {
			return fmt.Sprintf("router %+v, want a session with each of 2 hosts", s.Router)
		}
		for h, state := range s.Router.Sessions {
			if state != "Established" {
				return fmt.Sprintf("the router's session with %s is %s", h, state)
			}
		}
		for _, n := range s.Nodes {
			if len(n.PodCIDRs) != 2 || len(internalIPs[n.Name]) != 2 {
				return fmt.Sprintf("node %s: pod CIDRs %v, InternalIPs %v", n.Name, n.PodCIDRs, internalIPs[n.Name])
			}
			for i, cidr := range n.PodCIDRs {
				if want := cidr + " via " + internalIPs[n.Name][i]; !strings.Contains(n.RouterRoute, want) {
					return fmt.Sprintf("node %s (%s): the router's routes %q, want %q", n.Name, n.Host, n.RouterRoute, want)
				}
			}
		}
		return ""
	})

	// The second host's replica does not lead: it routes its own bridge,
	// every pod CIDR via its node, in both families.
	eventually(t, hosts[1].Name+"'s bridge routing every pod CIDR", time.Minute, time.Second, func() string {
		for _, n := range l.status().Nodes {
			for i, cidr := range n.PodCIDRs {
				family := "-4"
				if strings.Contains(cidr, ":") {
					family = "-6"
				}
				out, err := exec.Command("ip", "-n", hosts[1].Netns, family, "route", "show", cidr).CombinedOutput()
				if want := "via " + internalIPs[n.Name][i] + " dev " + lab.Bridge; err != nil || !strings.Contains(string(out), want) {
					return fmt.Sprintf("%s: route to %s is %q (%v), want %q", hosts[1].Name, cidr, strings.TrimSpace(string(out)), err, want)
				}
			}
		}
		return ""
	})

	// One VIP, pods on both hosts behind it.
	l.apply(netexec("web", 4, "") + "---\n" + loadBalancer("web", false))
	l.mustKubectl("rollout", "status", "deployment/web", "--timeout=5m")
	podNode, _ := l.podsOf("web")
	podIPs := map[string][]string{} // pod -> its IPs, IPv4 first
	for _, line := range strings.Split(l.mustKubectl("get", "pods", "-l", "app=web", "-o", `jsonpath={range .items[*]}{.metadata.name} {.status.podIPs[*].ip}{"\n"}{end}`), "\n") {
		if f := strings.Fields(line); len(f) == 3 {
			podIPs[f[0]] = f[1:]
		}
	}
	podOn := map[string]string{} // host -> a pod on it
	for p, n := range podNode {
		podOn[hostOf[n]] = p
	}
	if len(podOn) != 2 {
		t.Fatalf("the web pods run on hosts %v (pods %v), want both", podOn, podNode)
	}
	vip := ""
	answeredFrom := map[string]bool{} // hosts
	eventually(t, "the VIP answered by pods on both hosts", 2*time.Minute, 250*time.Millisecond, func() string {
		if vip, _ = l.announcer("default/web"); vip == "" {
			return "no VIP in status yet"
		}
		got, err := l.curl("http://" + vip + "/hostname")
		if n, ok := podNode[got]; err == nil && ok {
			answeredFrom[hostOf[n]] = true
		}
		if len(answeredFrom) < 2 {
			return fmt.Sprintf("answered from hosts %v so far (last %q %v)", answeredFrom, got, err)
		}
		return ""
	})

	// A RequireDualStack Service: both VIPs answered on the LAN.
	l.apply(`apiVersion: v1
kind: Service
metadata: {name: web-dual}
spec:
  type: LoadBalancer
  ipFamilyPolicy: RequireDualStack
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
`)
	eventually(t, "both VIPs of a RequireDualStack Service answered", 2*time.Minute, 250*time.Millisecond, func() string {
		vips := strings.Fields(l.mustKubectl("get", "svc", "web-dual", "-o", "jsonpath={.status.loadBalancer.ingress[*].ip}"))
		if len(vips) != 2 {
			return fmt.Sprintf("VIPs %v, want one of each family", vips)
		}
		for _, v := range vips {
			got, err := l.curl("http://" + net.JoinHostPort(v, "80") + "/hostname")
			if _, ok := podNode[got]; err != nil || !ok {
				return fmt.Sprintf("%s: %q %v", v, got, err)
			}
		}
		return ""
	})

	// Pod to pod across hosts, both ways, in both families: a guest's
	// gateway is the router (its IPv4 one by DHCP, its IPv6 one by the
	// router's advertisements), which routes each pod CIDR to its node.
	for _, pair := range [][2]string{{hosts[0].Name, hosts[1].Name}, {hosts[1].Name, hosts[0].Name}} {
		a, b := podOn[pair[0]], podOn[pair[1]]
		if len(podIPs[b]) != 2 {
			t.Errorf("pod %s has IPs %v, want one of each family", b, podIPs[b])
		}
		for _, ip := range podIPs[b] {
			url := "http://" + net.JoinHostPort(ip, "8080") + "/hostname"
			got, err := l.kubectl(time.Minute, "exec", a, "--", "wget", "-qO-", "-T", "5", url)
			if strings.TrimSpace(got) != b {
				t.Errorf("pod %s on %s fetched pod %s on %s at %s: %q %v", a, pair[0], b, pair[1], url, got, err)
			}
		}
	}

	// Lose the second host whole, as when it loses power (lab.LoseHost).
	// First, a VIP answered from it: Services over the same pods until
	// one is placed there.
	lost := hosts[1]
	lostVIP := ""
	for i := 0; i < 12 && lostVIP == ""; i++ {
		name := fmt.Sprintf("web-%d", i)
		l.apply(fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %s}
spec:
  type: LoadBalancer
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
`, name))
		eventually(t, name+" placed", time.Minute, 250*time.Millisecond, func() string {
			v, node := l.announcer("default/" + name)
			if v == "" || node == "" {
				return "no VIP or node in status"
			}
			if hostOf[node] == lost.Name {
				lostVIP = v
			}
			return ""
		})
	}
	if lostVIP == "" {
		t.Fatalf("none of 12 VIPs placed on %s's node", lost.Name)
	}
	// Each host answers for its own nodes: with the leader's replica (on
	// the first host) stopped, a LAN client still gets the second host's
	// node's MAC for the VIP placed there, from the second host's replica.
	if leads, err := lab.ReplicaLeads(t.Context(), st, hosts[0].Name); err != nil || !leads {
		t.Fatalf("%s's replica leads: %v (%v); want the first host's", hosts[0].Name, leads, err)
	}
	client := newLANClient(t)
	before := waitARP(t, client, lostVIP, 30*time.Second)
	leader := st.Pids[lab.CCMProcess]
	if err := syscall.Kill(leader, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	resume := func() {
		if stopped {
			_ = syscall.Kill(leader, syscall.SIGCONT)
			stopped = false
		}
	}
	t.Cleanup(resume)
	for i := range 5 {
		mac, err := resolve(client, lostVIP, time.Second)
		if err != nil || mac.String() != before.String() {
			t.Errorf("ARP request %d for %s with the leader stopped: %v %v, want %s", i, lostVIP, mac, err, before)
		}
		time.Sleep(200 * time.Millisecond)
	}
	resume()

	// A VIP that moves from the first host's node to the second's is
	// answered by the second host's replica once it reads the Service's
	// condition: the client's ARP answer names the second node's MAC.
	movingVIP, from := "", ""
	for _, s := range l.status().Services {
		if hostOf[s.Node] == hosts[0].Name && !strings.Contains(s.VIP, ":") {
			movingVIP, from = s.VIP, s.Node
			break
		}
	}
	if movingVIP == "" {
		t.Fatalf("no IPv4 VIP placed on %s's node", hosts[0].Name)
	}
	was := waitARP(t, client, movingVIP, 30*time.Second)
	destroyed := time.Now()
	if err := lab.NodeAction(st, from, "stop"); err != nil {
		t.Fatal(err)
	}
	var movedAfter time.Duration
	eventually(t, movingVIP+" answered for the second host's node", 30*time.Second, 10*time.Millisecond, func() string {
		mac, err := resolve(client, movingVIP, 200*time.Millisecond)
		if err != nil || mac.String() == was.String() {
			return fmt.Sprintf("ARP answer %v %v", mac, err)
		}
		movedAfter = time.Since(destroyed)
		return ""
	})
	eventually(t, "status naming the second host's node for "+movingVIP, 30*time.Second, 250*time.Millisecond, func() string {
		for _, s := range l.status().Services {
			if s.VIP == movingVIP && hostOf[s.Node] != hosts[1].Name {
				return fmt.Sprintf("answered by %q", s.Node)
			}
		}
		return ""
	})
	t.Logf("VIP %s moved off %s: a new MAC answered ARP %s after virDomainDestroy was called (libvirt's destroy path included)", movingVIP, from, movedAfter.Round(time.Millisecond))
	// The hypervisor confirmed the domain down: the out-of-service taint
	// has its pods deleted (and out of the endpoints) at once, long before
	// the Node turns NotReady.
	eventually(t, "every web pod on "+from+" deleted", time.Minute, 100*time.Millisecond, func() string {
		out := l.mustKubectl("get", "pods", "-l", "app=web", "-o", `jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.metadata.deletionTimestamp}{"\n"}{end}`)
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[1] == from {
				return "pod " + f[0] + " on " + from + " not being deleted"
			}
		}
		return ""
	})
	t.Logf("the web pods on %s were being deleted %s after virDomainDestroy was called (out-of-service taint)", from, time.Since(destroyed).Round(time.Millisecond))
	if err := lab.NodeAction(st, from, "start"); err != nil {
		t.Fatal(err)
	}
	// Back, its kubelet reports again, and the web pods are ready.
	eventually(t, from+" reporting Ready again", 4*time.Minute, time.Second, func() string {
		out := l.mustKubectl("get", "node", from, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}`)
		status, beat, _ := strings.Cut(out, " ")
		at, err := time.Parse(time.RFC3339, beat)
		if status != "True" || err != nil || !at.After(destroyed) {
			return "Ready " + out
		}
		return ""
	})
	// Its pods ran on the other host meanwhile: spread them over both hosts
	// again (scheduled afresh, as at first) for the loss of a host.
	l.mustKubectl("scale", "deployment/web", "--replicas=0")
	eventually(t, "no web pod", 2*time.Minute, 250*time.Millisecond, func() string {
		return l.mustKubectl("get", "pods", "-l", "app=web", "-o", "name")
	})
	l.mustKubectl("scale", "deployment/web", "--replicas=4")
	l.mustKubectl("rollout", "status", "deployment/web", "--timeout=5m")
	podNode, _ = l.podsOf("web")
	clear(podOn)
	for p, n := range podNode {
		podOn[hostOf[n]] = p
	}
	if len(podOn) != 2 {
		t.Fatalf("the web pods run on hosts %v (pods %v) once %s is back, want both", podOn, podNode, from)
	}

	killed := time.Now()
	if err := lab.LoseHost(st, lost.Name); err != nil {
		t.Fatal(err)
	}
	eventually(t, "VIP "+lostVIP+" answered from "+hosts[0].Name+" after losing "+lost.Name, 3*time.Minute, 50*time.Millisecond, func() string {
		got, err := l.curl("http://" + lostVIP + "/hostname")
		if err != nil || hostOf[podNode[got]] != hosts[0].Name {
			return fmt.Sprintf("%q %v", got, err)
		}
		return ""
	})
	t.Logf("VIP %s answered from %s %.2fs after %s was lost (replica, libvirtd, sshd and guests frozen: noticed by libvirt's keepalive over ssh)", lostVIP, hosts[0].Name, time.Since(killed).Seconds(), lost.Name)
	// BFD (300 ms x 3) takes the lost host's routes out of the router.
	eventually(t, "the router without "+lost.Name+"'s routes", time.Minute, 100*time.Millisecond, func() string {
		for _, n := range l.status().Nodes {
			if n.Host == lost.Name && n.RouterRoute != "" {
				return fmt.Sprintf("node %s: the router's route %q", n.Name, n.RouterRoute)
			}
		}
		return ""
	})
	t.Logf("the router dropped %s's pod CIDRs %.2fs after it was lost", lost.Name, time.Since(killed).Seconds())
	// No Node is deleted while its hypervisor cannot be asked.
	time.Sleep(30 * time.Second)
	if n := len(l.status().Nodes); n != 2 {
		t.Errorf("%d Nodes 30 s after losing %s, want 2: none deleted while its hypervisor cannot be asked", n, lost.Name)
	}

	// down removes every host: namespaces, libvirtd, CCM replica, dirs.
	pids := maps.Clone(st.Pids)
	for k, v := range lost.Pids {
		pids[lost.Name+"/"+k] = v
	}
	// What else runs in the lost host's namespace: its network's dnsmasq.
	inLost, err := exec.Command("ip", "netns", "pids", lost.Netns).Output()
	if err != nil {
		t.Errorf("ip netns pids %s: %v (is the namespace named in the host's mount namespace?)", lost.Netns, err)
	}
	for _, p := range strings.Fields(string(inLost)) {
		pid, _ := strconv.Atoi(p)
		pids[lost.Name+"/pid "+p] = pid
	}
	if len(strings.Fields(string(inLost))) == 0 {
		t.Errorf("nothing runs in %s before down; want its dnsmasq", lost.Netns)
	}
	l.downTwiceLeavesNothing(pids)
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), lost.Netns) || strings.Contains(string(out), lab.RouterNetns) {
		t.Errorf("namespaces left behind: %s", out)
	}
	if left, _ := filepath.Glob("/run/labcloud/host2-*"); len(left) > 0 {
		t.Errorf("the second host's libvirtd directories left behind: %v", left)
	}
}
