package lab

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/examples"
	"github.com/labcloud/labcloud/lab/controlplane"
	"github.com/labcloud/labcloud/lab/guest"
	"github.com/labcloud/labcloud/lab/host"
	"github.com/labcloud/labcloud/lab/image"
	"github.com/labcloud/labcloud/lab/libvirtd"
)

type upRun struct {
	opts       Options
	st         *State
	start      time.Time
	tokens     []controlplane.Token // the guests' kubelet credentials
	proxyToken string               // kube-proxy's, shared by every node
	dnsToken   string               // CoreDNS's (user labcloud:coredns)
}

// upStep is one named step of up.
type upStep struct {
	name string
	f    func() error
}

func (u *upRun) step(name string, f func() error) error {
	t := time.Now()
	fmt.Fprintf(u.opts.Out, "[%6.1fs] %s ...\n", time.Since(u.start).Seconds(), name)
	if err := f(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	d := time.Since(t).Seconds()
	u.st.Steps = append(u.st.Steps, Step{Name: name, Seconds: d})
	_ = u.st.Save()
	fmt.Fprintf(u.opts.Out, "[%6.1fs] %s done in %.1fs\n", time.Since(u.start).Seconds(), name, d)
	return nil
}

// Up brings the lab up. It must run as root inside the lab's network
// namespace (cmd/labcloud arranges that). The daemons it starts outlive it.
func Up(ctx context.Context, opts Options) (*State, error) {
	opts.Light = false
	u, err := beginUp(opts)
	if err != nil {
		return nil, err
	}
	u.st.Hosts = labHosts(opts.Dir, opts.Hosts, u.st.Addressing)
	if opts.Routed {
		u.st.Routed = true
		routeHosts(u.st.Hosts, u.st.Addressing)
	}
	if err := u.run(u.fullSteps(ctx)); err != nil {
		return u.st, err
	}
	fmt.Fprintf(u.opts.Out, "lab up in %.1fs\n", time.Since(u.start).Seconds())
	return u.st, u.st.Save()
}

// beginUp checks opts and records an empty lab in opts.Dir: the prologue
// of both modes.
func beginUp(opts Options) (*upRun, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, err
	}
	u := &upRun{opts: opts, start: time.Now(), st: &State{Dir: opts.Dir, Netns: Netns, Pids: map[string]int{}, Light: opts.Light, IPFamily: opts.IPFamily.orIPv4(), Addressing: opts.addressing(), InsecureRegistries: opts.InsecureRegistries, Started: time.Now()}}
	return u, u.st.Save()
}

// run runs steps in order, timing each; it stops at the first that fails.
func (u *upRun) run(steps []upStep) error {
	for _, s := range steps {
		if err := u.step(s.name, s.f); err != nil {
			return err
		}
	}
	return nil
}

// fullSteps are the steps of a lab of real guests.
func (u *upRun) fullSteps(ctx context.Context) []upStep {
	opts := u.opts
	var (
		ccmBin, labNodeBin string
		art                image.Artifacts
		disk               image.Disk
		cp                 *controlplane.ControlPlane
		client             kubernetes.Interface
	)
	steps := []upStep{
		{"control-plane tools", func() (err error) { u.st.Tools, err = ensureTools(ctx, u.repo(), opts.Out); return err }},
		{"build CCM and lab-node", func() (err error) { ccmBin, labNodeBin, err = ensureBinaries(ctx, u.repo()); return err }},
		{"guest boot image", func() (err error) {
			art, err = image.Build(ctx, image.Options{Out: filepath.Join(CacheDir(), "image")})
			return err
		}},
		{"node root disk", func() (err error) {
			disk, err = image.BuildRootDisk(ctx, image.DiskOptions{
				Tools: u.st.Tools, LabNode: labNodeBin, KernelRelease: art.KernelRelease, Out: filepath.Join(CacheDir(), "image"),
			})
			if err == nil && !disk.Cached {
				fmt.Fprintf(opts.Out, "           built %s\n", disk.Path)
			}
			return err
		}},
		{"claim the host's libvirtd", u.claimHost},
		{"libvirtd", func() error {
			d, err := libvirtd.StartDetached(ctx, opts.Dir)
			if err != nil {
				return err
			}
			u.st.Pids["libvirtd"], u.st.Pids["virtlogd"] = d.Pids()
			// Domains persist in libvirt's configuration: a lab that was
			// killed left its guests defined, and defining them again by
			// name would fail. The host lock says they are no lab's now.
			removeGuests(opts.Out)
			return nil
		}},
		{fmt.Sprintf("libvirt network %s (%s)", NetworkName, u.st.IPFamily), func() error {
			if err := noIPv6DAD(); err != nil {
				return err
			}
			return u.st.CreateNetwork(u.st.Hosts[0])
		}},
		{"multipath hash per connection", func() error { return spreadPerConnection(u.st.IPFamily) }},
		{"image registry (labcloud load)", func() error { return u.startRegistry(ctx) }},
	}
	if len(u.st.Hosts) > 1 {
		steps = append(steps, upStep{fmt.Sprintf("hosts 2-%d: namespace, libvirtd, network", len(u.st.Hosts)), func() error { return u.startOtherHosts(ctx) }})
	}
	// The guests boot while the control plane starts: a TCG guest needs
	// longer to boot than the API server to start, and its kubelet retries.
	steps = append(steps, []upStep{
		{"control plane credentials", func() (err error) { cp, err = u.prepareControlPlane(); return err }},
		{fmt.Sprintf("boot %d guests", opts.Nodes), func() error { return u.bootGuests(cp, art, disk) }},
		{"etcd, kube-apiserver, kube-controller-manager, kube-scheduler", func() (err error) {
			client, err = u.runControlPlane(ctx, cp)
			return err
		}},
	}...)
	steps = append(steps, u.forwarderStep(ctx)...)
	// The first answer's pod starts on the first node up while the others
	// come up. It is created once that node is: a pod created before any
	// Node existed was retried by the scheduler 30 s later, not when the
	// nodes came.
	var fa *firstAnswerRun
	nodesWait := opts.waitFor(opts.Nodes)
	return append(steps, []upStep{
		{"cluster DNS (CoreDNS)", func() error { return u.startDNS(ctx, cp, client) }},
		{"LAN router (FRR, BGP)", func() error { return u.startRouter(ctx) }},
		{"libvirt-cloud-controller-manager", func() error { return u.startCCM(ctx, cp, client, ccmBin) }},
		{"a first node registered, initialized, routed", func() error { return waitLab(ctx, client, u.st, nodesWait, opts.Out, labProgress.anyDone) }},
		{"first answer's pod and LoadBalancer Service", func() (err error) {
			fa, err = startFirstAnswer(ctx, client, nodesWait+firstAnswerBound)
			return err
		}},
		{"nodes registered, initialized, routed", func() error {
			err := waitLab(ctx, client, u.st, nodesWait, opts.Out, labProgress.done)
			if err != nil {
				fa.stop()
			}
			return err
		}},
		{FirstAnswerStep, func() error { return fa.await(opts.Out) }},
	}...)
}

// forwarderStep serves the API server on the host's loopback, when asked.
func (u *upRun) forwarderStep(ctx context.Context) []upStep {
	if u.opts.HostListener == nil {
		return nil
	}
	return []upStep{{"API server on the host's loopback", func() error { return u.startForwarder(ctx) }}}
}

// claimHost waits until no e2e run or other lab uses the host (its one
// libvirtd, the lab's namespace name), then holds the host lock through a
// process that outlives up; down stops it.
func (u *upRun) claimHost() error {
	release, err := libvirtd.Lock(context.Background(), func() {
		fmt.Fprintln(u.opts.Out, "           waiting for an e2e run or another lab to release the host")
	})
	if err != nil {
		return err
	}
	release()
	holder, err := libvirtd.HoldLock(u.opts.Dir)
	if err != nil {
		return err
	}
	u.st.Pids["lock-holder"] = holder.Pid()
	return nil
}

func (u *upRun) repo() string {
	if u.opts.Repo != "" {
		return u.opts.Repo
	}
	wd, _ := os.Getwd()
	return wd
}

// ensureTools returns the control-plane binaries' directory. From a
// checkout it runs hack/build-tools.sh, which builds what is missing or
// stale (CoreDNS's plugins change with the lab) and is a no-op otherwise;
// without one it takes the installed tools as they are.
func ensureTools(ctx context.Context, repo string, out io.Writer) (string, error) {
	script := filepath.Join(repo, "hack", "build-tools.sh")
	if _, err := os.Stat(script); err != nil {
		// A cache built before CoreDNS and porter's TLS pair joined lacks those.
		if d, err := controlplane.FindTools(); err == nil && isFile(filepath.Join(d, "coredns")) && isFile(filepath.Join(d, "porter", "localhost.key")) {
			return d, nil
		}
		return "", fmt.Errorf("control-plane binaries missing and no labcloud checkout to build them from (%s): run make tools", script)
	}
	cmd := exec.CommandContext(ctx, script)
	cmd.Stderr = out
	if os.Getenv("LABCLOUD_E2E") == "" { // up needs neither e2e.test nor Ginkgo
		cmd.Env = append(os.Environ(), "LABCLOUD_E2E=false")
	}
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w", script, err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1], nil
}

// ensureBinaries returns the CCM and lab-node binaries: next to this
// executable when they are there (make build), else built from repo.
func ensureBinaries(ctx context.Context, repo string) (ccm, labNode string, err error) {
	if exe, err := os.Executable(); err == nil {
		dir := filepath.Dir(exe)
		c, n := filepath.Join(dir, "libvirt-cloud-controller-manager"), filepath.Join(dir, "lab-node")
		if isFile(c) && isFile(n) {
			return c, n, nil
		}
	}
	if !isFile(filepath.Join(repo, "go.mod")) {
		return "", "", fmt.Errorf("libvirt-cloud-controller-manager and lab-node are not next to labcloud and %s is no checkout to build them from", repo)
	}
	bin := filepath.Join(CacheDir(), "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", "", err
	}
	// make build stamps the version, as for every binary users run.
	build := exec.CommandContext(ctx, "make", "-s", "build", "BIN="+bin)
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("make build: %w: %s", err, out)
	}
	return filepath.Join(bin, "libvirt-cloud-controller-manager"), filepath.Join(bin, "lab-node"), nil
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// noIPv6DAD turns duplicate address detection off for the links made
// from now on in the lab's namespace (up runs there): the bridge has no
// carrier until a guest is plugged in, and until then an address under
// detection stays tentative, so CoreDNS and the API server could not bind
// the bridge's IPv6 address. The lab owns the link and pins every guest
// elsewhere: there is nothing to detect.
func noIPv6DAD() error {
	return os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_dad", []byte("0"), 0o644)
}

// spreadPerConnection has the lab's host spread routed connections to VIPs
// over the CCM's multipath routes per connection, as docs/reference.md tells
// users to: the sysctl makes the kernel hash a connection's ports as well
// as its addresses. It is per network namespace, and up runs in the lab's.
func spreadPerConnection(f IPFamily) error {
	if err := os.WriteFile("/proc/sys/net/ipv4/fib_multipath_hash_policy", []byte("1"), 0o644); err != nil || !f.HasIPv6() {
		return err
	}
	return os.WriteFile("/proc/sys/net/ipv6/fib_multipath_hash_policy", []byte("1"), 0o644)
}

// prepareControlPlane makes the tokens of the nodes, kube-proxy and
// CoreDNS, and the lab's control plane with its credentials, not running
// yet: the guests boot with them while it starts.
func (u *upRun) prepareControlPlane() (*controlplane.ControlPlane, error) {
	var tokens []controlplane.Token
	for i := 1; i <= u.opts.Nodes; i++ {
		tokens = append(tokens, controlplane.Token{Token: controlplane.NewToken(), User: "system:node:" + nodeName(i), Groups: []string{"system:nodes"}})
	}
	u.tokens = tokens
	u.proxyToken = controlplane.NewToken()
	u.dnsToken = controlplane.NewToken()
	tokens = append(tokens, controlplane.Token{Token: u.proxyToken, User: "system:kube-proxy"}, controlplane.Token{Token: u.dnsToken, User: dnsUser})
	a := u.st.addressing()
	return u.newControlPlane(controlplane.Options{
		Address: a.apiAddress, AltIPs: []string{a.Gateway(), Gateway6},
		ClusterCIDR: strings.Join(a.clusterCIDRs, ","), NodeCIDRMaskSizeIPv6: nodeMaskSize6,
		ServiceCIDR: strings.Join(a.serviceCIDRs, ","),
		Tokens:      tokens, Scheduler: true,
	})
}

// newControlPlane is the lab's control plane as opts describe it (the
// address, CIDRs, tokens; the rest is the lab's), its credentials written.
func (u *upRun) newControlPlane(opts controlplane.Options) (*controlplane.ControlPlane, error) {
	opts.Tools, opts.Dir, opts.Port, opts.Daemon = u.st.Tools, filepath.Join(u.st.Dir, "controlplane"), APIPort, true
	return controlplane.New(opts)
}

// runControlPlane starts cp's daemons, records them in the state, and
// applies examples/rbac.yaml.
func (u *upRun) runControlPlane(ctx context.Context, cp *controlplane.ControlPlane) (kubernetes.Interface, error) {
	err := cp.Run(ctx)
	for _, p := range cp.Processes() {
		u.st.Pids[p.Name] = p.Pid()
	}
	if err != nil {
		return nil, err
	}
	u.st.Kubeconfig, u.st.APIServer = cp.AdminKube, cp.URL
	client, err := AdminClient(cp.AdminKube)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(u.st.Tools, "kubectl"), "--kubeconfig", cp.AdminKube, "apply", "-f", "-")
	cmd.Stdin = bytes.NewReader(examples.RBAC)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("apply examples/rbac.yaml: %w: %s", err, out)
	}
	return client, nil
}

func AdminClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 100, 200
	return kubernetes.NewForConfig(cfg)
}

// bootGuests boots the guests, spread round robin over the lab's hosts.
func (u *upRun) bootGuests(cp *controlplane.ControlPlane, art image.Artifacts, disk image.Disk) error {
	conns := make([]*libvirt.Connect, len(u.st.Hosts))
	for k, h := range u.st.Hosts {
		c, err := libvirt.NewConnect(h.URI)
		if err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
		defer c.Close()
		conns[k] = c
	}
	connOf := func(i int) *libvirt.Connect { return conns[hostOfGuest(i, len(conns))-1] }
	nodes := filepath.Join(u.st.Dir, "nodes")
	if err := os.MkdirAll(nodes, 0o700); err != nil {
		return err
	}
	typ, why := guest.ChooseAccel(guest.GatherEvidence())
	if typ == guest.KVM {
		fmt.Fprintln(u.opts.Out, "           guests use KVM")
	} else {
		fmt.Fprintf(u.opts.Out, "           guests use TCG: %s\n", why)
	}
	guests := make(map[string]guest.Guest, u.opts.Nodes)
	index := make(map[string]int, u.opts.Nodes)
	for i := 1; i <= u.opts.Nodes; i++ {
		name := nodeName(i)
		initrd := filepath.Join(nodes, name+".initrd")
		files, err := nodeFiles(nodeIdentity{
			Name:         name,
			APIServer:    u.st.addressing().apiServerURL(),
			CAPEM:        cp.CAData,
			KubeletToken: u.tokens[i-1].Token,
			ProxyToken:   u.proxyToken,
			Addressing:   u.st.addressing(),
			Insecure:     u.st.InsecureRegistries,
		})
		if err != nil {
			return err
		}
		if err := image.WriteNodeInitrd(initrd, art.Initramfs, files); err != nil {
			return err
		}
		g := guest.Guest{Name: name, Initrd: initrd, Kernel: art.Kernel, Disk: disk.Path, Console: consoleLog(u.st.Dir, name),
			MAC: nodeMAC(i), Network: NetworkName, HostCoresEach: runtime.NumCPU() / u.opts.Nodes}
		if err := g.Boot(connOf(i), typ); err != nil {
			return err
		}
		guests[name], index[name] = g, i
		u.st.Nodes = append(u.st.Nodes, name)
	}
	if typ == guest.KVM {
		if err := u.bootSilentWithTCG(func(name string) *libvirt.Connect { return connOf(index[name]) }, guests); err != nil {
			return err
		}
	}
	if len(conns) > 1 {
		fmt.Fprintf(u.opts.Out, "           %d guests booting on %d hosts, round robin; consoles in %s\n", u.opts.Nodes, len(conns), nodes)
	} else {
		fmt.Fprintf(u.opts.Out, "           %d guests booting; consoles in %s\n", u.opts.Nodes, nodes)
	}
	return u.st.Save()
}

// kvmConsoleBound is how long a KVM guest may stay silent on its console
// before it is taken for one a broken KVM hangs, and booted with TCG.
const kvmConsoleBound = 20 * time.Second

// bootSilentWithTCG boots with TCG each KVM guest that has written nothing
// to its console within kvmConsoleBound: an unknown broken KVM costs
// seconds, not a hung up.
func (u *upRun) bootSilentWithTCG(connOf func(name string) *libvirt.Connect, guests map[string]guest.Guest) error {
	silent := silentConsoles(guests, time.Now().Add(kvmConsoleBound), 250*time.Millisecond)
	for _, name := range silent {
		fmt.Fprintf(u.opts.Out, "           %s: no console output %s after booting with KVM; booting it with TCG\n", name, kvmConsoleBound)
		c := connOf(name)
		d, err := c.LookupDomainByName(name)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		err = d.Destroy()
		d.Free()
		if err != nil {
			return fmt.Errorf("destroy %s: %w", name, err)
		}
		if err := guests[name].Boot(c, guest.TCG); err != nil {
			return err
		}
	}
	return nil
}

// silentConsoles waits until every guest has written to its console or
// the deadline passes, and names those that have not, sorted.
func silentConsoles(guests map[string]guest.Guest, deadline time.Time, poll time.Duration) []string {
	for {
		var silent []string
		for name, g := range guests {
			if fi, err := os.Stat(g.Console); err != nil || fi.Size() == 0 {
				silent = append(silent, name)
			}
		}
		if len(silent) == 0 || !time.Now().Before(deadline) {
			slices.Sort(silent)
			return silent
		}
		time.Sleep(poll)
	}
}

// waitLab waits up to timeout until enough of the lab's nodes are done
// (Ready and initialized by the CCM (providerID), with a pod CIDR whose
// route is on the bridge), printing progress as it changes. On timeout it
// names, per node not done, what that node lacks.
func waitLab(ctx context.Context, client kubernetes.Interface, st *State, timeout time.Duration, out io.Writer, enough func(labProgress) bool) error {
	var (
		last    labProgress // from the last check that could read everything
		lastErr error       // of the last check, nil when it could
		printed string
	)
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var p labProgress
		p, lastErr = labReady(ctx, client, st)
		msg := p.String()
		if lastErr != nil {
			msg = lastErr.Error()
		} else {
			last = p
		}
		if msg != printed && (lastErr != nil || !enough(p)) {
			fmt.Fprintf(out, "           waiting: %s\n", msg)
		}
		printed = msg
		return lastErr == nil && enough(p), nil
	})
	if err != nil && ctx.Err() == nil {
		return labTimeoutError(timeout, last, lastErr)
	}
	return err
}

// labTimeoutError says what the lab's nodes still lack after timeout,
// from the last check that could read everything, and why the last check
// could not if it could not.
func labTimeoutError(timeout time.Duration, last labProgress, lastErr error) error {
	summary := ""
	if last != nil {
		summary = last.String()
	}
	return waitTimeoutError("lab", timeout, summary, last.missing(), lastErr, "labcloud logs NODE for a guest's console, labcloud logs ccm")
}

// labReady judges the lab's nodes from the API server's Nodes and the
// CCM's routes on the bridge.
func labReady(ctx context.Context, client kubernetes.Interface, st *State) (labProgress, error) {
	routes, err := host.PodCIDRRoutes("", Bridge)
	if err != nil {
		return nil, fmt.Errorf("routes on %s: %w", Bridge, err)
	}
	if st.Routed { // each host routes its own nodes' pod CIDRs
		for _, h := range st.LabHosts()[1:] {
			theirs, err := host.PodCIDRRoutes(h.Netns, Bridge)
			if err != nil {
				return nil, fmt.Errorf("routes on %s's %s: %w", h.Name, Bridge, err)
			}
			maps.Copy(routes, theirs)
		}
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Nodes: %w", err)
	}
	// One pod CIDR of each of the cluster's families, each routed.
	return judgeLab(st.Nodes, nodes.Items, len(st.addressing().clusterCIDRs), routes), nil
}

// podCIDRs are a Node's pod CIDRs, one per family.
func podCIDRs(n *v1.Node) []string {
	if len(n.Spec.PodCIDRs) > 0 {
		return n.Spec.PodCIDRs
	}
	if n.Spec.PodCIDR != "" {
		return []string{n.Spec.PodCIDR}
	}
	return nil
}

func nodeIsReady(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}
