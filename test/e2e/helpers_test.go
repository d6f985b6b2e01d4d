package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"libvirt.org/go/libvirt"

	"github.com/prometheus/procfs"

	"github.com/labcloud/labcloud/examples"
	"github.com/labcloud/labcloud/lab/controlplane"
)

// randomMAC returns a MAC in QEMU's locally administered 52:54:00 range.
func randomMAC() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", b[0], b[1], b[2])
}

// defineDomain defines (and optionally starts) a diskless TCG domain with
// one NIC on the e2e network. With no disk, firmware network-boots: the
// NIC's boot ROM asks for a DHCP lease, so the domain gets a real lease
// without a guest OS.
func defineDomain(t testing.TB, name string, start bool) (uuid, mac string) {
	t.Helper()
	mac = randomMAC()
	xml := fmt.Sprintf(`<domain type='qemu'>
  <name>%s</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='network'/></os>
  <on_crash>destroy</on_crash>
  <devices>
    <interface type='network'>
      <mac address='%s'/>
      <source network='%s'/>
      <model type='virtio'/>
    </interface>
    <serial type='pty'/>
  </devices>
</domain>`, name, mac, env.network)
	d, err := env.virt.DomainDefineXML(xml)
	if err != nil {
		t.Fatalf("define domain %s: %v", name, err)
	}
	defer d.Free()
	if start {
		if err := d.Create(); err != nil {
			t.Fatalf("start domain %s: %v", name, err)
		}
	}
	uuid, _ = d.GetUUIDString()
	t.Cleanup(func() { removeDomain(name) })
	return uuid, mac
}

func domain(t testing.TB, name string) *libvirt.Domain {
	t.Helper()
	d, err := env.virt.LookupDomainByName(name)
	if err != nil {
		t.Fatalf("domain %s: %v", name, err)
	}
	t.Cleanup(func() { d.Free() })
	return d
}

func removeDomain(name string) {
	d, err := env.virt.LookupDomainByName(name)
	if err != nil {
		return
	}
	defer d.Free()
	if active, _ := d.IsActive(); active {
		_ = d.Destroy()
	}
	_ = d.Undefine()
}

func destroyAllDomains(c *libvirt.Connect) {
	doms, err := c.ListAllDomains(0)
	if err != nil {
		return
	}
	for _, d := range doms {
		if active, _ := d.IsActive(); active {
			_ = d.Destroy()
		}
		_ = d.Undefine()
		d.Free()
	}
}

// waitLease waits until the network's DHCP server leased an IPv4 address
// to mac (the network leases IPv6 addresses too). Three TCG guests
// booting on a 2-core host beside other packages' tests (go test ./...)
// took more than 90 s to their leases once.
func waitLease(t testing.TB, mac string) string {
	t.Helper()
	var ip string
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		n, err := env.virt.LookupNetworkByName(env.network)
		if err != nil {
			return false, err
		}
		defer n.Free()
		leases, err := n.GetDHCPLeases()
		if err != nil {
			return false, err
		}
		for _, l := range leases {
			if strings.EqualFold(l.Mac, mac) && l.Type == libvirt.IP_ADDR_TYPE_IPV4 {
				ip = l.IPaddr
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no DHCP lease for %s: %v", mac, err)
	}
	return ip
}

// ccm is one running libvirt-cloud-controller-manager.
type ccm struct {
	proc *controlplane.Process
	dir  string
	// securePort serves /healthz and /metrics (the upstream default
	// unless another CCM of this test runs beside it).
	securePort int
}

// startCCM runs the CCM binary as examples/ ships it: confined as the unit
// confines it (examples.CCMSandbox), with the flags of
// examples/libvirt-cloud-controller-manager.service (leader election,
// secure serving with delegated authentication and authorization) with
// the test's kubeconfig and cloud config in place of the unit's files, and
// the identity of examples/rbac.yaml. extraArgs are what a test must add
// (a subset of controllers, a feature gate). A second CCM running at the
// same time gets a secure port of its own, as a replica on another host would
// have one to itself.
func startCCM(t testing.TB, cloudConfig string, extraArgs ...string) *ccm {
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "cloud-config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cloudConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(dir, "ccm.kubeconfig")
	if err := env.cp.WriteKubeconfig(kc, "cloud-controller-manager", serviceAccountToken(t)); err != nil {
		t.Fatal(err)
	}
	args, err := examples.CCMArgs(map[string]string{examples.UnitKubeconfig: kc, examples.UnitCloudConfig: cfgPath})
	if err != nil {
		t.Fatal(err)
	}
	c := &ccm{dir: dir, securePort: defaultSecurePort}
	env.ccmMu.Lock()
	for _, other := range env.ccms {
		if !other.proc.Exited() {
			c.securePort = freePort(t)
			args = append(args, fmt.Sprintf("--secure-port=%d", c.securePort))
			break
		}
	}
	env.ccmMu.Unlock()
	args = append(args, extraArgs...)
	sandbox, err := examples.CCMSandbox()
	if err != nil {
		t.Fatal(err)
	}
	argv := sandbox.Wrap(append([]string{env.ccmBin}, args...))
	p, err := controlplane.StartProcess(context.Background(), filepath.Join(dir, "ccm.log"), argv[0], argv[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	c.proc = p
	trackCCM(t, c)
	return c
}

// defaultSecurePort is the upstream CCM's secure port (cloudprovider.CloudControllerManagerPort).
const defaultSecurePort = 10258

// leaseName is the Lease the shipped CCM elects its leader with.
const leaseName = "cloud-controller-manager"

// releaseLeaseIfLast forgets c and, when no CCM of the suite runs any
// more, deletes the leader Lease: a stopped CCM does not release it, and the
// next test's CCM would otherwise wait out its 15 s before doing anything.
func releaseLeaseIfLast(t testing.TB, c *ccm) {
	env.ccmMu.Lock()
	defer env.ccmMu.Unlock()
	env.ccms = slices.DeleteFunc(env.ccms, func(o *ccm) bool { return o == c })
	for _, o := range env.ccms {
		if !o.proc.Exited() {
			return
		}
	}
	err := env.admin.CoordinationV1().Leases("kube-system").Delete(context.Background(), leaseName, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete the CCM's leader lease: %v", err)
	}
}

// freePort returns a TCP port nothing listens on right now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// serviceAccountToken returns a token for kube-system/cloud-controller-manager,
// the identity examples/rbac.yaml grants the narrow ClusterRole to.
func serviceAccountToken(t testing.TB) string {
	t.Helper()
	tr, err := env.admin.CoreV1().ServiceAccounts("kube-system").CreateToken(context.Background(), "cloud-controller-manager",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](86400)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for the CCM service account: %v", err)
	}
	return tr.Status.Token
}

// libvirtCloudConfig is the cloud config for the e2e libvirtd.
func libvirtCloudConfig() string {
	return fmt.Sprintf(`region: e2e
host: e2e-host
hypervisors:
  - uri: qemu:///system
    zone: e2e-zone
networks: [%s]
addressSources: [dhcp-leases, arp]
`, env.network)
}

const uninitializedTaint = "node.cloudprovider.kubernetes.io/uninitialized"
const shutdownTaint = "node.cloudprovider.kubernetes.io/shutdown"

// createNode registers a Node as a kubelet with --cloud-provider=external
// does: with the uninitialized taint and no providerID.
func createNode(t testing.TB, name string, ready v1.ConditionStatus) *v1.Node {
	t.Helper()
	n := createNodeWithStatus(t, name, v1.NodeStatus{})
	if ready != "" {
		setReady(t, name, ready)
	}
	return n
}

// createNodeWithStatus creates an uninitialized Node with status in the
// same write; it is deleted after the test.
func createNodeWithStatus(t testing.TB, name string, status v1.NodeStatus) *v1.Node {
	t.Helper()
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.NodeSpec{Taints: []v1.Taint{{Key: uninitializedTaint, Value: "true", Effect: v1.TaintEffectNoSchedule}}},
		Status:     status,
	}
	n, err := env.admin.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = env.admin.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	if len(n.Status.Addresses) != len(status.Addresses) || len(n.Status.Conditions) != len(status.Conditions) {
		t.Fatalf("node %s created without the status it was given: %+v", name, n.Status)
	}
	return n
}

// setReady sets the Node's Ready condition, as its kubelet would.
func setReady(t testing.TB, name string, status v1.ConditionStatus) {
	t.Helper()
	ctx := context.Background()
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := env.admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		now := metav1.Now()
		cond := v1.NodeCondition{Type: v1.NodeReady, Status: status, Reason: "E2E", LastHeartbeatTime: now, LastTransitionTime: now}
		replaced := false
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == v1.NodeReady {
				n.Status.Conditions[i], replaced = cond, true
			}
		}
		if !replaced {
			n.Status.Conditions = append(n.Status.Conditions, cond)
		}
		_, err = env.admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("set node %s Ready=%s: %v", name, status, err)
	}
}

func hasTaint(n *v1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

// waitNode polls the Node until cond holds; a nil Node means it is gone.
func waitNode(t testing.TB, name, what string, timeout time.Duration, cond func(*v1.Node) bool) *v1.Node {
	t.Helper()
	var last *v1.Node
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		n, err := env.admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			last = nil
			return cond(nil), nil
		}
		if err != nil {
			return false, err
		}
		last = n
		return cond(n), nil
	})
	if err != nil {
		t.Fatalf("node %s: %s did not happen within %s (last: %+v)", name, what, timeout, nodeSummary(last))
	}
	return last
}

func nodeSummary(n *v1.Node) string {
	if n == nil {
		return "<deleted>"
	}
	return fmt.Sprintf("providerID=%q taints=%v labels=%v addresses=%v", n.Spec.ProviderID, n.Spec.Taints, n.Labels, n.Status.Addresses)
}

// reconnect replaces the test's own libvirt connection after a restart.
func reconnect() (*libvirt.Connect, error) {
	env.virt.Close()
	return libvirt.NewConnect("qemu:///system")
}

// trackCCM registers a started CCM with the suite and stops it when the test
// ends, showing its log tail if the test failed.
func trackCCM(t testing.TB, c *ccm) {
	env.ccmMu.Lock()
	env.ccms = append(env.ccms, c)
	env.ccmMu.Unlock()
	t.Cleanup(func() {
		c.proc.Stop()
		if t.Failed() {
			t.Logf("CCM log tail:\n%s", c.proc.Tail(40))
		}
		releaseLeaseIfLast(t, c)
	})
}

// parentOf is process pid's parent and the parent's command name.
func parentOf(pid int) (int, string, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, "", err
	}
	stat, err := p.Stat()
	if err != nil {
		return 0, "", err
	}
	parent, err := procfs.NewProc(stat.PPID)
	if err != nil {
		return 0, "", err
	}
	comm, err := parent.Comm()
	return stat.PPID, comm, err
}

// cmdline is process pid's arguments.
func cmdline(pid int) ([]string, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return nil, err
	}
	return p.CmdLine()
}
