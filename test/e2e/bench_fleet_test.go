package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/procfs"
	"github.com/vishvananda/netlink"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// A fleet is many Nodes at once for the memory and steady-state
// benchmarks: libvirt's test driver holds one running domain per Node,
// each with a NIC on the e2e bridge (so that placement may pick it), and
// each Node registers as a kubelet with --cloud-provider=external does,
// reports Ready, and renews its node Lease as a kubelet does, so that its
// Node object does not change while the benchmark watches.
//
// Addresses: the benchmark adds fleetSubnet to the bridge; node i has
// 10.90.8.0+i, which the CCM learns from the shipped "arp" address source:
// the bridge's neighbour table holds an entry for each domain's MAC (the
// test driver keeps no DHCP leases, and its guest agent answers for bridged
// NICs with one address for all). VIPs come from fleetPool.
const (
	fleetSubnet = "10.90.0.1/19"
	fleetPool   = "10.90.16.0/22"
	fleetResync = 5 * time.Minute // the cloud config's resyncPeriod
)

type fleet struct {
	prefix   string
	n        int
	fixtures []string // one per hypervisor host; node i's domain is in fixtures[i % len]

	stopLeases func()
}

func fleetNodeName(prefix string, i int) string { return fmt.Sprintf("%s-%04d", prefix, i) }

// fleetIP is node i's InternalIP: 10.90.8.0 + i.
func fleetIP(i int) string {
	base := netip.MustParseAddr("10.90.8.0").As4()
	v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	v += uint32(i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
}

func fleetMAC(i int) string {
	return fmt.Sprintf("52:54:02:%02x:%02x:%02x", (i>>16)&0xff, (i>>8)&0xff, i&0xff)
}

// ipBatch runs ip -batch; a failed line fails the benchmark when strict.
func ipBatch(b testing.TB, lines string, strict bool) {
	cmd := exec.Command("ip", "-force", "-batch", "-")
	cmd.Stdin = strings.NewReader(lines)
	if out, err := cmd.CombinedOutput(); err != nil && strict {
		b.Fatalf("ip -batch: %v: %s", err, out)
	}
}

// newFleet writes the fixture (n running test-driver domains with a NIC on
// the e2e bridge) and adds the fleet's subnet to the bridge. Nodes are
// created by register.
func newFleet(b testing.TB, prefix string, n int) *fleet { return newFleetOnHosts(b, prefix, n, 1) }

// newFleetOnHosts is newFleet with the domains spread over hosts
// test-driver hypervisors, one fixture each, round robin.
func newFleetOnHosts(b testing.TB, prefix string, n, hosts int) *fleet {
	bridgeSubnet(b, fleetSubnet)
	var paths []string
	for h := range hosts {
		var sb strings.Builder
		sb.WriteString(`<node><cpu><mhz>2000</mhz><model>x86_64</model><active>64</active><total>64</total><nodes>1</nodes><sockets>1</sockets><cores>64</cores><threads>1</threads></cpu><memory>1073741824</memory>
`)
		for i := h; i < n; i += hosts {
			fmt.Fprintf(&sb, `<domain type='test'><name>%s</name><uuid>dddddddd-0000-0000-0000-%012d</uuid><memory>2097152</memory><currentMemory>2097152</currentMemory><vcpu>2</vcpu><os><type arch='x86_64'>hvm</type></os><devices><interface type='bridge'><mac address='%s'/><source bridge='%s'/></interface></devices></domain>
`, fleetNodeName(prefix, i), i, fleetMAC(i), env.bridge)
		}
		sb.WriteString("</node>\n")
		path := filepath.Join(b.TempDir(), fmt.Sprintf("fleet-%d.xml", h))
		if err := os.WriteFile(path, []byte(sb.String()), 0o600); err != nil {
			b.Fatal(err)
		}
		paths = append(paths, path)
	}
	f := &fleet{prefix: prefix, n: n, fixtures: paths, stopLeases: func() {}}
	// Neighbour entries as the host learns them from a guest's traffic
	// (stale until used: the CCM reads them, the kernel never probes them).
	var neigh, unneigh strings.Builder
	for i := range n {
		fmt.Fprintf(&neigh, "neigh replace %s lladdr %s dev %s nud stale\n", fleetIP(i), fleetMAC(i), env.bridge)
		fmt.Fprintf(&unneigh, "neigh del %s dev %s\n", fleetIP(i), env.bridge)
	}
	ipBatch(b, neigh.String(), true)
	b.Cleanup(func() {
		f.stopLeases()
		flushOwnedRoutes(b) // the CCM has stopped: nothing removes them
		ipBatch(b, unneigh.String(), false)
		ctx := context.Background()
		_ = env.admin.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = env.admin.CoordinationV1().Leases(v1.NamespaceNodeLease).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	})
	return f
}

// cloudConfig is the CCM's cloud config for the fleet: the test-driver
// hypervisors (with several, each on a host of its own, zone bench-H, and
// the CCM on the first's), the shipped address sources, routes and load
// balancers on the e2e bridge.
func (f *fleet) cloudConfig() string {
	hvs := fmt.Sprintf("hypervisors: [{uri: 'test+unix://%s', zone: bench}]", f.fixtures[0])
	if len(f.fixtures) > 1 {
		hvs = "host: bench-0\nhypervisors:"
		for h, path := range f.fixtures {
			hvs += fmt.Sprintf("\n  - {uri: 'test+unix://%s', zone: bench-%d, host: bench-%d}", path, h, h)
		}
	}
	return fmt.Sprintf(`region: bench
%s
addressSources: [dhcp-leases, arp]
resyncPeriod: %s
routes:
  bridge: %s
loadBalancer:
  bridge: %s
  pools: [{name: bench, addresses: [%s]}]
`, hvs, fleetResync, env.bridge, env.bridge, fleetPool)
}

// register creates every Node (32 clients at once), reports it Ready with
// its InternalIP, starts renewing the node Leases every renew, and waits
// until the CCM has initialized them all.
func (f *fleet) register(b testing.TB, renew, timeout time.Duration) {
	ctx := context.Background()
	var mu sync.Mutex
	var errs []error
	createAll(f.n, func(i int) {
		if err := registerNode(ctx, fleetNodeName(f.prefix, i)); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	})
	if len(errs) > 0 {
		b.Fatalf("%d of %d Nodes not registered, first: %v", len(errs), f.n, errs[0])
	}
	f.stopLeases = renewLeases(f.prefix, f.n, renew)
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := env.admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false, nil
		}
		done := 0
		for i := range list.Items {
			n := &list.Items[i]
			if strings.HasPrefix(n.Name, f.prefix+"-") && n.Spec.ProviderID != "" && !hasTaint(n, uninitializedTaint) {
				done++
			}
		}
		return done == f.n, nil
	})
	if err != nil {
		b.Fatalf("the fleet's %d Nodes not all initialized within %s", f.n, timeout)
	}
}

// registerNode creates a Node as a kubelet with --cloud-provider=external
// does (no address: the CCM finds it), then reports it Ready.
func registerNode(ctx context.Context, name string) error {
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Spec:       v1.NodeSpec{Taints: []v1.Taint{{Key: uninitializedTaint, Value: "true", Effect: v1.TaintEffectNoSchedule}}},
	}
	n, err := env.admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	if err := renewLease(ctx, name); err != nil {
		return err
	}
	now := metav1.Now()
	n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
	for range 20 {
		_, err = env.admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			break
		}
		// The CCM or kube-controller-manager wrote first.
		if n, err = env.admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
			break
		}
		n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
	}
	if err != nil {
		return fmt.Errorf("report node %s ready: %w", name, err)
	}
	return nil
}

// renewLease creates or renews the Node's Lease in kube-node-lease, which
// kube-controller-manager reads as the kubelet's heartbeat.
func renewLease(ctx context.Context, name string) error {
	leases := env.admin.CoordinationV1().Leases(v1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: v1.NamespaceNodeLease},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.RenewTime = &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// renewLeases renews the fleet's node Leases every period until stopped.
func renewLeases(prefix string, n int, period time.Duration) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			createAll(n, func(i int) { _ = renewLease(ctx, fleetNodeName(prefix, i)) })
		}
	}()
	return func() { cancel(); <-done }
}

// createServices creates n LoadBalancer Services named prefix-NNNN (32
// clients at once) and waits until each has a VIP in its status and the
// host's neighbour table answers that VIP with a node's MAC (the
// announcer's permanent entry on the bridge).
func createServices(b testing.TB, prefix string, n int, timeout time.Duration) {
	ctx := context.Background()
	var mu sync.Mutex
	var errs []error
	createAll(n, func(i int) {
		svc := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%04d", prefix, i), Namespace: "default"},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer,
				Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
		}
		if _, err := env.admin.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	})
	if len(errs) > 0 {
		b.Fatalf("%d of %d Services not created, first: %v", len(errs), n, errs[0])
	}
	var vips, announced int
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := env.admin.CoreV1().Services("default").List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false, nil
		}
		answered := permanentNeighbours(b)
		vips, announced = 0, 0
		for i := range list.Items {
			s := &list.Items[i]
			if !strings.HasPrefix(s.Name, prefix+"-") || len(s.Status.LoadBalancer.Ingress) == 0 {
				continue
			}
			vips++
			if ip, err := netip.ParseAddr(s.Status.LoadBalancer.Ingress[0].IP); err == nil && answered[ip] {
				announced++
			}
		}
		return announced == n, nil
	})
	if err != nil {
		b.Fatalf("%d Services: %d have a VIP, %d announced on %s after %s", n, vips, announced, env.bridge, timeout)
	}
}

// permanentNeighbours are the addresses with a permanent neighbour entry on
// the bridge: the VIPs the announcer answers for.
func permanentNeighbours(b testing.TB) map[netip.Addr]bool {
	link, err := netlink.LinkByName(env.bridge)
	if err != nil {
		b.Fatalf("bridge %s: %v", env.bridge, err)
	}
	neighs, err := netlink.NeighList(link.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return nil // interrupted dump: the caller polls again
	}
	out := map[netip.Addr]bool{}
	for _, n := range neighs {
		if ip, ok := netip.AddrFromSlice(n.IP); ok && n.State&netlink.NUD_PERMANENT != 0 && n.HardwareAddr != nil {
			out[ip.Unmap()] = true
		}
	}
	return out
}

// procMem is one reading of a process's memory from /proc/PID/status, in
// bytes: resident anonymous memory (heap, stacks, the C allocations of
// libvirt), resident file-backed pages (the binary's and libraries' code
// and read-only data), and the kernel's high-water mark of their sum.
type procMem struct {
	anon, file, rss, hwm int64
}

func readProcMem(pid int) (procMem, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return procMem{}, err
	}
	st, err := p.NewStatus()
	if err != nil {
		return procMem{}, err
	}
	return procMem{anon: int64(st.RssAnon), file: int64(st.RssFile), rss: int64(st.VmRSS), hwm: int64(st.VmHWM)}, nil
}

// memSampler tracks the peaks of a process's anonymous and file-backed RSS
// (the kernel keeps only the peak of their sum, VmHWM), every 20 ms.
type memSampler struct {
	pid   int
	mu    sync.Mutex
	peak  procMem
	phase procMem // peaks since phasePeaks last ran
	stop  func()
}

func sampleMem(b *testing.B, pid int) *memSampler {
	s := &memSampler{pid: pid}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			if m, err := readProcMem(pid); err == nil {
				s.mu.Lock()
				s.peak, s.phase = s.peak.max(m), s.phase.max(m)
				s.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	s.stop = func() { cancel(); <-done }
	b.Cleanup(s.stop)
	return s
}

func (s *memSampler) peaks() procMem {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

// phasePeaks returns the peaks since the last call (or the start) and
// starts counting anew: which part of a run the peak belongs to.
func (s *memSampler) phasePeaks() procMem {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.phase
	s.phase = procMem{}
	return p
}

// max is the larger of each reading of m and o.
func (m procMem) max(o procMem) procMem {
	return procMem{anon: max(m.anon, o.anon), file: max(m.file, o.file), rss: max(m.rss, o.rss), hwm: max(m.hwm, o.hwm)}
}

func mib(v int64) float64 { return float64(v) / (1 << 20) }
