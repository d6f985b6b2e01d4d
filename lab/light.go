package lab

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/labcloud/labcloud/lab/controlplane"
	"github.com/labcloud/labcloud/lab/explain"
	"github.com/labcloud/labcloud/provider"
)

// Light mode: no guests and no libvirtd. The CCM talks to libvirt's test
// driver, whose fixture holds one running domain per node, and a simulator
// process registers the Nodes as kubelets would. Only the API server's
// loopback address is used, so the namespace needs no bridge.
const (
	MaxLightNodes = 10000
	// lightClusterCIDR has room for MaxLightNodes /24 pod CIDRs and stays
	// clear of the service range (10.96.0.0/16).
	lightClusterCIDR = "10.128.0.0/10"
	// The fixture's network: the test driver's guest agent answers with an
	// address derived from it (network + 2 + 20*(id-1)), so a /12 keeps
	// MaxLightNodes addresses distinct.
	lightNetAddr, lightNetMask = "10.208.0.1", "255.240.0.0"
	lightZone                  = "lab-host"
	simulatorUser              = "labcloud-simulator"
	// SimulatorPid is the State.Pids key of the simulator process.
	SimulatorPid = "simulator"
)

// lightNodeName names node i (1-based) of n, zero-padded so that names sort
// in node order.
func lightNodeName(i, n int) string {
	return fmt.Sprintf("%s%0*d", NodePrefix, len(strconv.Itoa(n)), i)
}

// fixtureUUID is the UUID of node i's domain, which the simulated node
// reports as its system UUID.
func fixtureUUID(i int) string { return fmt.Sprintf("1abc0000-0000-4000-8000-%012d", i) }

// LightNode is node i (1-based) of a light lab of n: its name and its
// domain's UUID.
func LightNode(i, n int) (name, systemUUID string) { return lightNodeName(i, n), fixtureUUID(i) }

func fixturePath(dir string) string { return filepath.Join(dir, "fixture.xml") }

// LibvirtURI is the hypervisor the lab's CCM (and status) talks to.
func (s *State) LibvirtURI() string {
	if s.Light {
		return "test://" + fixturePath(s.Dir)
	}
	return labURI
}

// writeFixture writes a test-driver fixture of n running domains, one per
// light-mode node, in a format libvirt 9.0 accepts.
func writeFixture(path string, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("test-driver fixture: %w", err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintf(w, `<node>
  <cpu><mhz>2000</mhz><model>x86_64</model><active>64</active><total>64</total><nodes>1</nodes><sockets>1</sockets><cores>64</cores><threads>1</threads></cpu>
  <memory>1073741824</memory>
  <network><name>%s</name><uuid>1abc0000-0000-4000-8000-ffffffffffff</uuid><bridge name='%s'/><forward mode='route'/><ip address='%s' netmask='%s'/></network>
`, NetworkName, Bridge, lightNetAddr, lightNetMask)
	for i := 1; i <= n; i++ {
		fmt.Fprintf(w, `  <domain type='test'><name>%s</name><uuid>%s</uuid><memory>2097152</memory><currentMemory>2097152</currentMemory><vcpu>2</vcpu><os><type arch='x86_64'>hvm</type></os><devices><interface type='network'><mac address='%s'/><source network='%s'/></interface></devices></domain>
`, lightNodeName(i, n), fixtureUUID(i), nodeMAC(i), NetworkName)
	}
	fmt.Fprintln(w, "</node>")
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("test-driver fixture %s: %w", path, err)
	}
	return f.Close()
}

// heartbeatFor is how often the simulator renews each Lease: every 10 s as
// a kubelet does for small labs, slower for big ones so that the API server
// sees at most ~25 renewals a second.
func heartbeatFor(n int) time.Duration {
	return min(max(time.Duration(n)*time.Second/25, 10*time.Second), 5*time.Minute)
}

// gracePeriodFor is kube-controller-manager's --node-monitor-grace-period
// for that heartbeat: its default (50 s), or four heartbeats if longer.
func gracePeriodFor(heartbeat time.Duration) time.Duration {
	return max(50*time.Second, 4*heartbeat)
}

// UpLight brings the light lab up: Up's flow with other steps. It runs as
// root inside the lab's namespace; the daemons it starts outlive it.
func UpLight(ctx context.Context, opts Options) (*State, error) {
	opts.Light = true
	u, err := beginUp(opts)
	if err != nil {
		return nil, err
	}
	heartbeat := heartbeatFor(opts.Nodes)
	if err := u.run(u.lightSteps(ctx, heartbeat)); err != nil {
		return u.st, err
	}
	fmt.Fprintf(u.opts.Out, "light lab up in %.1fs (leases renewed every %s)\n\n", time.Since(u.start).Seconds(), heartbeat)
	if err := u.st.Save(); err != nil {
		return u.st, err
	}
	s, err := GetStatus(ctx, u.st)
	if err != nil {
		return u.st, err
	}
	s.WriteSummary(u.opts.Out, 20)
	return u.st, nil
}

// lightSteps are the steps of a light lab: the test driver's domains and
// simulated kubelets renewing their Leases every heartbeat.
func (u *upRun) lightSteps(ctx context.Context, heartbeat time.Duration) []upStep {
	opts, st := u.opts, u.st
	simToken := controlplane.NewToken()
	var (
		ccmBin string
		cp     *controlplane.ControlPlane
		client kubernetes.Interface
	)
	steps := []upStep{
		{"control-plane tools", func() (err error) { st.Tools, err = ensureTools(ctx, u.repo(), opts.Out); return err }},
		// No libvirtd, but the lab's namespace name is the host's one lab.
		{"claim the host", u.claimHost},
		{"build CCM", func() (err error) { ccmBin, _, err = ensureBinaries(ctx, u.repo()); return err }},
		{fmt.Sprintf("test-driver fixture of %d domains", opts.Nodes), func() error {
			for i := 1; i <= opts.Nodes; i++ {
				st.Nodes = append(st.Nodes, lightNodeName(i, opts.Nodes))
			}
			return writeFixture(fixturePath(st.Dir), opts.Nodes)
		}},
		{"etcd, kube-apiserver, kube-controller-manager", func() (err error) {
			cp, client, err = u.startLightControlPlane(ctx, simToken, gracePeriodFor(heartbeat))
			return err
		}},
	}
	steps = append(steps, u.forwarderStep(ctx)...)
	return append(steps, []upStep{
		{"libvirt-cloud-controller-manager (test driver)", func() error { return u.startLightCCM(ctx, cp, client, ccmBin) }},
		{fmt.Sprintf("simulator of %d nodes", opts.Nodes), func() error { return u.startSimulator(cp, simToken, heartbeat) }},
		{"nodes registered, initialized", func() error { return waitLight(ctx, client, st, opts.waitFor(opts.Nodes), opts.Out) }},
	}...)
}

func (u *upRun) startLightControlPlane(ctx context.Context, simToken string, grace time.Duration) (*controlplane.ControlPlane, kubernetes.Interface, error) {
	cp, err := u.newControlPlane(controlplane.Options{
		Address:               "127.0.0.1",
		ClusterCIDR:           lightClusterCIDR,
		Tokens:                []controlplane.Token{{Token: simToken, User: simulatorUser}},
		ControllerManagerArgs: []string{"--node-monitor-grace-period", grace.String()},
	})
	if err != nil {
		return nil, nil, err
	}
	client, err := u.runControlPlane(ctx, cp)
	if err != nil {
		return nil, nil, err
	}
	if err := grantSimulator(ctx, client); err != nil {
		return nil, nil, err
	}
	return cp, client, nil
}

// grantSimulator lets the simulator do what its kubelets do: create Nodes
// and create and renew their Leases; nothing else.
func grantSimulator(ctx context.Context, client kubernetes.Interface) error {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "labcloud:simulator"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"create", "get"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create", "get", "patch"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "labcloud:simulator"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: simulatorUser}},
	}
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("ClusterRole %s: %w", role.Name, err)
	}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("ClusterRoleBinding %s: %w", binding.Name, err)
	}
	return nil
}

// lightCloudConfig: the test driver keeps no DHCP leases, but its guest
// agent answers; no routes and no load balancers without a bridge.
func lightCloudConfig(st *State) provider.Config {
	cfg := provider.DefaultConfig()
	cfg.Region = "lab"
	cfg.Host = labHost
	cfg.Hypervisors = []provider.HypervisorConfig{{URI: st.LibvirtURI(), Zone: lightZone, Host: labHost}}
	cfg.AddressSources = []string{provider.SourceGuestAgent}
	return cfg
}

func (u *upRun) startLightCCM(ctx context.Context, cp *controlplane.ControlPlane, client kubernetes.Interface, bin string) error {
	// As shipped: without a bridge in the cloud config the provider offers
	// no routes and no load balancers, and those controllers stay idle.
	data, err := marshalCloudConfig(lightCloudConfig(u.st))
	if err != nil {
		return err
	}
	return u.runCCM(ctx, cp, client, bin, data)
}

// startSimulator starts `labcloud simulate` as a daemon in this namespace.
func (u *upRun) startSimulator(cp *controlplane.ControlPlane, token string, heartbeat time.Duration) error {
	kc := filepath.Join(u.st.Dir, "simulator.kubeconfig")
	if err := cp.WriteKubeconfig(kc, simulatorUser, token); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the labcloud binary for the simulator: %w", err)
	}
	p, err := controlplane.StartDaemon(filepath.Join(u.st.Dir, "simulator.log"), self, "simulate",
		"--kubeconfig", kc, "--nodes", strconv.Itoa(u.opts.Nodes), "--heartbeat", heartbeat.String())
	if err != nil {
		return err
	}
	u.st.Pids[SimulatorPid] = p.Pid()
	time.Sleep(200 * time.Millisecond)
	if p.Exited() {
		return fmt.Errorf("the simulator exited at start:\n%s", p.Tail(20))
	}
	return nil
}

// lightProgress counts the light lab's nodes by how far they got.
type lightProgress struct{ registered, initialized, ready int }

func (p lightProgress) String() string {
	return fmt.Sprintf("%d registered, %d initialized (providerID, zone, no uninitialized taint), %d Ready", p.registered, p.initialized, p.ready)
}

func countLight(nodes []v1.Node) lightProgress {
	var p lightProgress
	for i := range nodes {
		n := &nodes[i]
		p.registered++
		if len(lightUninitialized(n)) == 0 {
			p.initialized++
		}
		if nodeIsReady(n) {
			p.ready++
		}
	}
	return p
}

const uninitializedTaint = "node.cloudprovider.kubernetes.io/uninitialized"

// lightUninitialized names what the CCM has yet to do to the light lab's
// Node n: none when it is initialized.
func lightUninitialized(n *v1.Node) []string {
	var out []string
	if n.Spec.ProviderID == "" {
		out = append(out, "no providerID")
	}
	if z := n.Labels[v1.LabelTopologyZone]; z != lightZone {
		out = append(out, fmt.Sprintf("zone %q, want %q", z, lightZone))
	}
	if tainted(n, uninitializedTaint) {
		out = append(out, "still tainted "+uninitializedTaint)
	}
	return out
}

// lightLacks names, for each of the light lab's nodes (names) not yet
// registered, initialized and Ready, what it lacks.
func lightLacks(names []string, nodes []v1.Node) []nodeLacks {
	byName := nodesByName(nodes)
	var out []nodeLacks
	for _, name := range names {
		n := byName[name]
		if n == nil {
			out = append(out, nodeLacks{node: name, lacks: []string{"not registered (no Node; the simulator's log says why)"}})
			continue
		}
		var lacks []string
		if why := explain.NodeNotReady(n); why != "" {
			lacks = append(lacks, "not Ready ("+why+")")
		}
		if un := lightUninitialized(n); len(un) > 0 {
			lacks = append(lacks, "not initialized by the CCM: "+strings.Join(un, ", "))
		}
		if len(lacks) > 0 {
			out = append(out, nodeLacks{node: name, lacks: lacks})
		}
	}
	return out
}

// waitLight waits up to timeout until every node is registered,
// initialized by the CCM and Ready, printing progress at most every 2 s.
// On timeout it names, per node not done, what that node lacks.
func waitLight(ctx context.Context, client kubernetes.Interface, st *State, timeout time.Duration, out io.Writer) error {
	total := len(st.Nodes)
	var cur, printed lightProgress
	var printedAt time.Time
	var last *v1.NodeList // the last that could be read
	var lastErr error     // of the last List
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		// From the API server's watch cache: cheap even for thousands.
		list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if lastErr = err; err != nil {
			return false, nil
		}
		last = list
		cur = countLight(list.Items)
		if cur.initialized == total && cur.ready == total {
			fmt.Fprintf(out, "           %s\n", cur)
			return true, nil
		}
		if cur != printed && time.Since(printedAt) >= 2*time.Second {
			fmt.Fprintf(out, "           waiting: %s of %d\n", cur, total)
			printed, printedAt = cur, time.Now()
		}
		return false, nil
	})
	if err != nil && ctx.Err() == nil {
		return lightTimeoutError(timeout, st.Nodes, last, lastErr)
	}
	return err
}

// lightTimeoutError says what the light lab's nodes (names) still lack
// after timeout, from the last List that could be read, and why the last
// List failed if it did.
func lightTimeoutError(timeout time.Duration, names []string, last *v1.NodeList, lastErr error) error {
	summary, lacks := "", []nodeLacks(nil)
	if last != nil {
		summary, lacks = fmt.Sprintf("%s of %d", countLight(last.Items), len(names)), lightLacks(names, last.Items)
	}
	if lastErr != nil {
		lastErr = fmt.Errorf("list Nodes: %w", lastErr)
	}
	return waitTimeoutError("light lab", timeout, summary, lacks, lastErr, "labcloud logs simulator, labcloud logs ccm")
}

// WriteSummary writes the status table, or for more than rows nodes a
// summary line and the table of the first rows nodes.
func (s *Status) WriteSummary(w io.Writer, rows int) {
	if len(s.Nodes) <= rows {
		s.WriteTable(w)
		return
	}
	var ready, initialized int
	for _, n := range s.Nodes {
		if n.Ready == "True" {
			ready++
		}
		if n.ProviderID != "" {
			initialized++
		}
	}
	fmt.Fprintf(w, "%d nodes: %d Ready, %d with a providerID; the first %d (labcloud status lists them all):\n\n", len(s.Nodes), ready, initialized, rows)
	head := *s
	head.Nodes = s.Nodes[:rows]
	head.WriteTable(w)
}

func tainted(n *v1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}
