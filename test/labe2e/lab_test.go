// Package labe2e brings the whole lab up with the labcloud binary, real
// guests included, and checks the CCM contract end to end in it.
package labe2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/labcloud/labcloud/internal/e2etest"
	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/bench"
	"github.com/labcloud/labcloud/lab/image"
)

type labcloud struct {
	t   *testing.T
	bin string
	dir string
}

func (l *labcloud) run(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, l.bin, append([]string{"--state-dir", l.dir}, args...)...)
	cmd.Dir = e2etest.RepoRoot()
	// labcloud runs a copy of itself in the lab namespace (ip netns exec):
	// a timeout must end both, or the copy keeps the output pipe open and
	// finishes an up that nobody takes down.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (l *labcloud) must(timeout time.Duration, args ...string) string {
	l.t.Helper()
	out, err := l.run(timeout, args...)
	if err != nil {
		l.t.Fatalf("labcloud %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (l *labcloud) status() *lab.Status {
	l.t.Helper()
	out := l.must(time.Minute, "status", "--output", "json")
	var s lab.Status
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		l.t.Fatalf("status JSON: %v\n%s", err, out)
	}
	return &s
}

// eventually polls f every interval until it returns "" or timeout.
func eventually(t *testing.T, what string, timeout, interval time.Duration, f func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msg := f()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %s", what, timeout, msg)
		}
		time.Sleep(interval)
	}
}

// newLabcloud builds labcloud, the CCM and lab-node into a temporary
// directory and runs `labcloud down` when the test ends.
func newLabcloud(t *testing.T) *labcloud {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the lab test needs root (network namespace, libvirtd, QEMU); run `sudo make test`")
	}
	bin := t.TempDir()
	e2etest.Make(t, "build", "BIN="+bin)
	l := &labcloud{t: t, bin: filepath.Join(bin, "labcloud"), dir: filepath.Join(t.TempDir(), "lab")}
	t.Cleanup(func() {
		if t.Failed() {
			l.logCluster()
		}
		if out, err := l.run(5*time.Minute, "down"); err != nil {
			t.Errorf("labcloud down: %v\n%s", err, out)
		}
	})
	return l
}

// logCluster logs what a failed test's reader asks first: where every pod
// is and why, and the cluster's latest events.
func (l *labcloud) logCluster() {
	for _, args := range [][]string{
		{"get", "nodes,pods", "-A", "-o", "wide"},
		{"describe", "pods", "-A", "--field-selector=status.phase!=Running"},
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
	} {
		out, err := l.kubectl(time.Minute, args...)
		if lines := strings.Split(out, "\n"); len(lines) > 80 {
			out = strings.Join(lines[len(lines)-80:], "\n")
		}
		l.t.Logf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// downTwiceLeavesNothing runs labcloud down twice and checks that the
// namespace, the state directory and every process in pids are gone.
func (l *labcloud) downTwiceLeavesNothing(pids map[string]int) {
	l.t.Helper()
	// A pid is only the same process if its command line is the same.
	cmdlines := map[string][]byte{}
	for name, pid := range pids {
		cmdlines[name], _ = os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	}
	l.must(5*time.Minute, "down")
	l.must(5*time.Minute, "down")
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), lab.Netns+" ") || strings.HasPrefix(string(out), lab.Netns) {
		l.t.Errorf("network namespace %s left behind: %s", lab.Netns, out)
	}
	if _, err := os.Stat(l.dir); !os.IsNotExist(err) {
		l.t.Errorf("state directory %s left behind", l.dir)
	}
	for name, pid := range pids {
		// A zombie (empty command line) has ended; init reaps it.
		if cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && len(cmd) > 0 && bytes.Equal(cmd, cmdlines[name]) {
			l.t.Errorf("%s (pid %d) still runs after down", name, pid)
		}
	}
}

// kubectl runs kubectl inside the lab's namespace and returns its output.
// up brings the lab up with args, logs how long it took and what it
// printed, and returns its state.
func (l *labcloud) up(args ...string) *lab.State {
	l.t.Helper()
	start := time.Now()
	// Most of a long up is waiting for e2e runs to release the host's libvirtd.
	out := l.must(30*time.Minute, append([]string{"up"}, args...)...)
	l.t.Logf("labcloud up %s took %s:\n%s", strings.Join(args, " "), time.Since(start).Round(100*time.Millisecond), out)
	st, err := lab.LoadState(l.dir)
	if err != nil {
		l.t.Fatal(err)
	}
	return st
}

// nodeHosts reads from status each node's host and its InternalIPs in
// order (IPv4 first in a dual-stack lab).
func (l *labcloud) nodeHosts() (hostOf map[string]string, internalIPs map[string][]string) {
	hostOf, internalIPs = map[string]string{}, map[string][]string{}
	for _, n := range l.status().Nodes {
		hostOf[n.Name] = n.Host
		for _, a := range n.Addresses {
			if ip, ok := strings.CutPrefix(a, "InternalIP="); ok {
				internalIPs[n.Name] = append(internalIPs[n.Name], ip)
			}
		}
	}
	return hostOf, internalIPs
}

func (l *labcloud) kubectl(timeout time.Duration, args ...string) (string, error) {
	return l.run(timeout, append([]string{"exec", "--", "kubectl"}, args...)...)
}

func (l *labcloud) mustKubectl(args ...string) string {
	l.t.Helper()
	out, err := l.kubectl(2*time.Minute, args...)
	if err != nil {
		l.t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(out)
}

// curl fetches url from the lab's namespace (the host side of the bridge).
func (l *labcloud) curl(url string) (string, error) {
	out, err := l.run(15*time.Second, "exec", "--", "curl", "-sS", "--max-time", "3", url)
	return strings.TrimSpace(out), err
}

// announcer is the node status says answers for the Service's VIP.
func (l *labcloud) announcer(svc string) (vip, node string) {
	for _, s := range l.status().Services {
		if s.Service == svc {
			return s.VIP, s.Node
		}
	}
	return "", ""
}

// netexec is a Deployment of agnhost netexec on port 8080, on the nodes
// matching selector (none: anywhere).
func netexec(name string, replicas int, nodeName string) string {
	sel := ""
	if nodeName != "" {
		sel = fmt.Sprintf("      nodeSelector: {kubernetes.io/hostname: %s}\n", nodeName)
	}
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %[1]s}
spec:
  replicas: %[2]d
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
%[4]s      terminationGracePeriodSeconds: 1
      containers:
      - name: netexec
        image: %[3]s
        args: [netexec, --http-port=8080]
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
`, name, replicas, image.AgnhostImage, sel)
}

func loadBalancer(name string, local bool) string {
	policy := "Cluster"
	if local {
		policy = "Local"
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s}
spec:
  type: LoadBalancer
  externalTrafficPolicy: %[2]s
  selector: {app: %[1]s}
  ports: [{port: 80, targetPort: 8080}]
`, name, policy)
}

func (l *labcloud) apply(manifest string) {
	l.t.Helper()
	f := filepath.Join(l.t.TempDir(), "m.yaml")
	if err := os.WriteFile(f, []byte(manifest), 0o644); err != nil {
		l.t.Fatal(err)
	}
	l.mustKubectl("apply", "-f", f)
}

// podsOf returns the Running pods of app: name -> node, name -> pod IP.
func (l *labcloud) podsOf(app string) (nodes, ips map[string]string) {
	out := l.mustKubectl("get", "pods", "-l", "app="+app, "--field-selector=status.phase=Running",
		"-o", `jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIP}{"\n"}{end}`)
	nodes, ips = map[string]string{}, map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 {
			nodes[f[0]], ips[f[0]] = f[1], f[2]
		}
	}
	return nodes, ips
}

func TestLab(t *testing.T) {
	l := newLabcloud(t)
	args := []string{"--nodes", "2", "--insecure-registry", insecureRegistry}
	l.up(append([]string{"--fresh"}, args...)...)

	// Real kubelets, initialized by the CCM from libvirt with DHCP-lease
	// addresses, pod CIDRs and routes.
	s := l.status()
	if len(s.Nodes) != 2 {
		t.Fatalf("status shows %d nodes, want 2: %+v", len(s.Nodes), s.Nodes)
	}
	internalIP := map[string]string{}
	for _, n := range s.Nodes {
		if !strings.HasPrefix(n.ProviderID, "libvirt://") || n.Ready != "True" || n.DomainState != "running" {
			t.Errorf("node %s not initialized/ready/running: %+v", n.Name, n)
		}
		if n.Host == "" {
			t.Errorf("node %s has no HOST in status (the CCM's label libvirt.labcloud.io/host): %+v", n.Name, n)
		}
		for _, a := range n.Addresses {
			if ip, ok := strings.CutPrefix(a, "InternalIP="); ok && strings.HasPrefix(ip, "10.123.0.1") {
				internalIP[n.Name] = ip
			}
		}
		if internalIP[n.Name] == "" {
			t.Errorf("node %s has no InternalIP from the lab's DHCP range: %v", n.Name, n.Addresses)
		}
		if n.PodCIDR == "" || !strings.Contains(n.Route, "proto 76") {
			t.Errorf("node %s: pod CIDR %q route %q", n.Name, n.PodCIDR, n.Route)
		}
		for _, taint := range n.Taints {
			if taint == "node.cloudprovider.kubernetes.io/uninitialized" {
				t.Errorf("node %s still has the uninitialized taint", n.Name)
			}
		}
	}
	// The LAN router learned every Node's pod CIDR over BGP, via the Node.
	eventually(t, "the router's BGP route to every pod CIDR", 60*time.Second, time.Second, func() string {
		s := l.status()
		if s.Router == nil || s.Router.Session != "Established" {
			return fmt.Sprintf("router %+v, want its BGP session with the CCM Established", s.Router)
		}
		for _, n := range s.Nodes {
			if want := "via " + internalIP[n.Name]; n.RouterRoute != want {
				return fmt.Sprintf("node %s: the router's route %q, want %q", n.Name, n.RouterRoute, want)
			}
		}
		return ""
	})
	if rib := l.must(time.Minute, "router", "--", "show", "ip", "route", "bgp"); !strings.Contains(rib, s.Nodes[0].PodCIDR) {
		t.Errorf("labcloud router -- show ip route bgp lacks %s:\n%s", s.Nodes[0].PodCIDR, rib)
	}
	// Each guest's QEMU, daemonized by libvirtd, is adopted by the tini
	// that runs libvirtd (a subreaper), which reaps it the moment it dies:
	// libvirt reports a guest stopped only once its QEMU is reaped.
	tinis, err := exec.Command("pgrep", "-d,", "-x", "tini").Output()
	if err != nil {
		t.Fatalf("no tini runs (libvirtd's): %v", err)
	}
	for name := range internalIP {
		match := "guest=" + name + ","
		all, err := exec.Command("pgrep", "-f", match).Output()
		if err != nil {
			t.Fatalf("no QEMU process for %s: %v", name, err)
		}
		adopted, _ := exec.Command("pgrep", "-P", strings.TrimSpace(string(tinis)), "-f", match).Output()
		if !bytes.Equal(adopted, all) {
			t.Errorf("QEMU of %s: processes %q, of which %q are children of a tini (%s); want all", name, all, adopted, tinis)
		}
	}

	// From the host's own namespace, with the kubeconfig labcloud prints:
	// the API server answers through the forwarder on the host's loopback.
	kc := filepath.Join(t.TempDir(), "host.kubeconfig")
	if err := os.WriteFile(kc, []byte(l.must(time.Minute, "kubeconfig")), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := lab.LoadState(l.dir)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(filepath.Join(st.Tools, "kubectl"), "--kubeconfig", kc, "get", "nodes", "-o", "name").CombinedOutput(); err != nil || strings.Count(string(out), "node/") != 2 {
		t.Errorf("kubectl from the host with labcloud kubeconfig: %v\n%s", err, out)
	}
	versions := l.mustKubectl("get", "nodes", "-o", `jsonpath={.items[*].status.nodeInfo.kubeletVersion}`)
	if strings.Fields(versions)[0] != "v1.36.3" || len(strings.Fields(versions)) != 2 {
		t.Errorf("kubelet versions %q, want v1.36.3 on both nodes", versions)
	}
	zones := l.mustKubectl("get", "nodes", "-o", `jsonpath={.items[*].metadata.labels.topology\.kubernetes\.io/zone}`)
	if zones != "lab-host lab-host" {
		t.Errorf("zone labels %q, want lab-host on both nodes", zones)
	}

	// agnhost netexec, 3 replicas, behind a LoadBalancer: the VIP is
	// answered by the pods, through kube-proxy on the announcing node.
	l.apply(netexec("web", 3, "") + "---\n" + loadBalancer("web", false))
	l.mustKubectl("rollout", "status", "deployment/web", "--timeout=5m")
	podNode, podIP := l.podsOf("web")
	var vip, announcer string
	answered := map[string]bool{}
	eventually(t, "VIP answered by the web pods", 2*time.Minute, 500*time.Millisecond, func() string {
		if vip, announcer = l.announcer("default/web"); vip == "" || announcer == "" {
			return "no VIP or announcer in status yet"
		}
		got, err := l.curl("http://" + vip + "/hostname")
		if _, ok := podNode[got]; err != nil || !ok {
			return fmt.Sprintf("curl %s: %q %v", vip, got, err)
		}
		answered[got] = true
		return ""
	})
	// kube-proxy on a TCG guest may program the other pods' endpoints
	// seconds after the rollout is done: ask until two pods have answered,
	// for up to a minute.
	var failed []string // why requests failed, for the spread check below
	requests := 0
	for deadline := time.Now().Add(time.Minute); len(answered) < 2 && time.Now().Before(deadline); requests++ {
		got, err := l.curl("http://" + vip + "/hostname")
		if err != nil {
			failed = append(failed, fmt.Sprintf("%v: %s", err, got))
			continue
		}
		answered[got] = true
	}
	t.Logf("VIP %s announced via %s, answered by pods %v after %d requests, %d of them failed", vip, announcer, answered, requests, len(failed))
	// The host's route to the VIP spreads over both nodes (status reads it).
	eventually(t, "status shows the spread route to "+vip, time.Minute, time.Second, func() string {
		for _, s := range l.status().Services {
			if s.Service == "default/web" && len(s.RoutedVia) == 2 {
				return ""
			} else if s.Service == "default/web" {
				return fmt.Sprintf("routed via %v", s.RoutedVia)
			}
		}
		return "no default/web row"
	})
	if len(answered) < 2 {
		var routed []string
		for _, s := range l.status().Services {
			if s.Service == "default/web" {
				routed = s.RoutedVia
			}
		}
		t.Errorf("%d requests to %s in a minute reached only %v; kube-proxy should spread them over 3 pods (pods: %v; failed requests: %q; host route via %v)",
			requests, vip, answered, podNode, failed, routed)
	}

	// NodePort on every node.
	nodePort := l.mustKubectl("get", "svc", "web", "-o", "jsonpath={.spec.ports[0].nodePort}")
	for name, ip := range internalIP {
		got, err := l.curl(fmt.Sprintf("http://%s:%s/hostname", ip, nodePort))
		if _, ok := podNode[got]; err != nil || !ok {
			t.Errorf("NodePort %s on %s: %q %v", nodePort, name, got, err)
		}
	}

	// A pod reaches a pod on the other node by its pod IP: node -> host
	// bridge -> the CCM's pod-CIDR route -> the other node.
	crossed := false
	for a := range podNode {
		for b := range podNode {
			if podNode[a] == podNode[b] || crossed {
				continue
			}
			got := l.mustKubectl("exec", a, "--", "wget", "-qO-", "-T", "5", "http://"+podIP[b]+":8080/hostname")
			if got != b {
				t.Errorf("pod %s on %s fetched %s:8080/hostname (pod %s on %s): %q", a, podNode[a], podIP[b], b, podNode[b], got)
			}
			crossed = true
		}
	}
	if !crossed {
		t.Errorf("the 3 web pods all run on one node (%v): no cross-node check possible", podNode)
	}

	// A pod reaches the Service by name, through the shell as upstream's
	// e2e tests do: the kubelet's clusterDNS -> kube-dns -> the lab's CoreDNS.
	for a := range podNode {
		got := l.mustKubectl("exec", a, "--", "/bin/sh", "-c", "wget -qO- -T 5 http://web/hostname")
		if _, ok := podNode[got]; !ok {
			t.Errorf("pod %s fetched http://web/hostname by name: %q, want a web pod's name", a, got)
		}
		break
	}

	// From the host's own namespace: VIPs and pods reached, the host's
	// servers and names reached from a pod; an image of the host's loaded
	// and run on every node, also on one started again.
	checkReach(t, l)
	checkLoad(t, l)

	// externalTrafficPolicy: Local with the pods on one node: announced via
	// that node, the client's own address seen, and the VIP follows the pods.
	var other string
	for n := range internalIP {
		if n != announcer {
			other = n
		}
	}
	for i, target := range []string{other, announcer} {
		l.apply(netexec("local", 1, target) + "---\n" + loadBalancer("local", true))
		l.mustKubectl("rollout", "status", "deployment/local", "--timeout=5m")
		eventually(t, fmt.Sprintf("local VIP announced via %s (move %d)", target, i), 2*time.Minute, 500*time.Millisecond, func() string {
			lvip, node := l.announcer("default/local")
			if node != target {
				return fmt.Sprintf("VIP %s announced via %q", lvip, node)
			}
			got, err := l.curl("http://" + lvip + "/clientip")
			if err != nil || !strings.HasPrefix(got, lab.Addressing{}.Gateway()+":") {
				return fmt.Sprintf("clientip %q %v, want the lab host's own %s", got, err, lab.Addressing{}.Gateway())
			}
			return ""
		})
	}

	// The package under a real systemd takes over from the lab's CCM; the
	// checks below run against it, and it is purged at the end.
	// A node stopped above had its pods deleted by the out-of-service
	// taint and made again elsewhere: read the web pods again.
	l.mustKubectl("rollout", "status", "deployment/web", "--timeout=5m")
	podNode, _ = l.podsOf("web")
	purge := checkInstalled(t, l, vip, podNode)

	// labcloud bench, one run of each kind: every figure is seen, the
	// CCM's own (libvirt event -> gratuitous ARP) on the wire.
	checkBench(t, l)

	// Crash failover: the announcing node's QEMU is killed; pods on the
	// other node answer the VIP, and the Node gets the shutdown taint.
	_, announcer = l.announcer("default/web")
	qemu, err := exec.Command("pgrep", "-f", "guest="+announcer+",").Output()
	if err != nil {
		t.Fatalf("no QEMU process for %s: %v", announcer, err)
	}
	killed := time.Now()
	for _, pid := range strings.Fields(string(qemu)) {
		_ = exec.Command("kill", "-9", pid).Run()
	}
	eventually(t, "VIP answered by a pod on another node after "+announcer+" crashed", 3*time.Minute, 200*time.Millisecond, func() string {
		got, err := l.curl("http://" + vip + "/hostname")
		node := podNode[got]
		if node == "" { // a pod made since: the bench's stops had theirs deleted (out-of-service)
			fresh, _ := l.podsOf("web")
			node = fresh[got]
		}
		if err != nil || node == "" || node == announcer {
			return fmt.Sprintf("%q on %q %v", got, node, err)
		}
		return ""
	})
	t.Logf("VIP %s answered from a pod off %s %.2fs after its QEMU was killed", vip, announcer, time.Since(killed).Seconds())
	eventually(t, announcer+" gets the shutdown taint", 3*time.Minute, time.Second, func() string {
		for _, n := range l.status().Nodes {
			if n.Name == announcer {
				for _, taint := range n.Taints {
					if taint == "node.cloudprovider.kubernetes.io/shutdown" {
						return ""
					}
				}
				return fmt.Sprintf("taints %v ready %s", n.Taints, n.Ready)
			}
		}
		return "node gone"
	})

	purge()

	// down removes everything, twice.
	st, err = lab.LoadState(l.dir)
	if err != nil {
		t.Fatal(err)
	}
	l.downTwiceLeavesNothing(st.Pids)
	checkUplinkGone(t)
	if out, err := exec.Command("pgrep", "-f", "guest="+lab.NodePrefix).Output(); err == nil {
		t.Errorf("QEMU processes of lab guests left behind: %s", out)
	}

	// The first up's snapshot, restored twice; down after it too.
	checkRestored(t, l, args...)
	if st, err = lab.LoadState(l.dir); err != nil {
		t.Fatal(err)
	}
	l.downTwiceLeavesNothing(st.Pids)
}

// checkBench runs `labcloud bench --runs 1` on the lab and checks that
// each failover run saw every figure after its trigger: the libvirt event,
// the gratuitous ARP on the bridge, the host's neighbour entry, the
// client's answer and the node eligible again, and that the gratuitous
// ARP and the event are close. (The ARP may precede the bench's event by
// milliseconds: the CCM's libvirt connection can hear of it first.)
func checkBench(t *testing.T, l *labcloud) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "bench.json")
	log := l.must(20*time.Minute, "bench", "--runs", "1", "--output", out)
	t.Logf("labcloud bench --runs 1:\n%s", log)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res bench.Result
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatalf("bench JSON: %v\n%s", err, data)
	}
	kinds := map[string]bool{}
	for _, r := range res.Failovers {
		kinds[r.Kind] = true
		figures := map[string]*float64{"libvirt event": r.LibvirtEventSeconds, "gratuitous ARP": r.GARPSeconds,
			"neighbour": r.NeighbourSeconds, "client": r.Seconds, "eligible again": r.EligibleAgainSeconds}
		for name, v := range figures {
			if v == nil || *v < 0 {
				t.Errorf("%s run: %s figure %s, want one after the trigger (errors: %v)", r.Kind, name, show(v), r.Errors)
			}
		}
		if len(r.Errors) > 0 {
			t.Errorf("%s run: errors %v", r.Kind, r.Errors)
		}
		// The CCM moves the VIP when the guest's tap leaves the bridge,
		// before libvirt's clean-up ends in its event (e2e: ~0.2 s before).
		if d := r.GARPAfterEventSeconds; d == nil || *d < -1 || *d > 1 {
			t.Errorf("%s run: gratuitous ARP %s after the libvirt event, want within [-1, 1]", r.Kind, show(d))
		}
		if r.ToNode == "" || r.ToNode == r.From {
			t.Errorf("%s run: VIP moved from %s to %q", r.Kind, r.From, r.ToNode)
		}
	}
	if !kinds[bench.FailoverCrash] || !kinds[bench.FailoverStop] {
		t.Errorf("bench ran failovers %v, want a crash and a stop", kinds)
	}
	if len(res.ServiceToAnswer) != 2 || res.LabRSSMiB <= 0 {
		t.Errorf("bench: %d Service runs, lab RSS %.0f MiB", len(res.ServiceToAnswer), res.LabRSSMiB)
	}
}

func show(v *float64) string {
	if v == nil {
		return "none"
	}
	return fmt.Sprintf("%.3fs", *v)
}
