package e2e

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/labcloud/labcloud/provider/outofservice"
)

func TestNodeInitializedFromDomain(t *testing.T) {
	requireEnv(t)
	uuid, mac := defineDomain(t, "e2e-init", true)
	ip := waitLease(t, mac)
	startCCM(t, libvirtCloudConfig())
	createNode(t, "e2e-init", v1.ConditionTrue)

	// The taint goes with one update and the addresses follow in a status
	// patch of their own: wait for both.
	n := waitNode(t, "e2e-init", "initialization", 30*time.Second, func(n *v1.Node) bool {
		return n != nil && !hasTaint(n, uninitializedTaint) && len(n.Status.Addresses) > 0
	})
	if want := "libvirt://" + uuid; n.Spec.ProviderID != want {
		t.Errorf("providerID = %q, want %q", n.Spec.ProviderID, want)
	}
	for label, want := range map[string]string{
		"node.kubernetes.io/instance-type":       "1cpu-64mib",
		"topology.kubernetes.io/zone":            "e2e-zone",
		"topology.kubernetes.io/region":          "e2e",
		"libvirt.labcloud.io/hypervisor":         "e2e-zone",
		"libvirt.labcloud.io/host":               "e2e-host",
		"libvirt.labcloud.io/domain-type":        "qemu",
		"failure-domain.beta.kubernetes.io/zone": "e2e-zone",
	} {
		if got := n.Labels[label]; got != want {
			t.Errorf("label %s = %q, want %q", label, got, want)
		}
	}
	// The IPv4 lease first (the primary family when no --node-ip says
	// otherwise), then any DHCPv6 lease on the network's /64, then the
	// Hostname.
	var internal []string
	var hostname string
	for _, a := range n.Status.Addresses {
		switch a.Type {
		case v1.NodeInternalIP:
			internal = append(internal, a.Address)
		case v1.NodeHostName:
			hostname = a.Address
		}
	}
	v6ok := true
	for _, a := range internal[min(1, len(internal)):] {
		addr, err := netip.ParseAddr(a)
		v6ok = v6ok && err == nil && netip.MustParsePrefix("fd88::/64").Contains(addr)
	}
	if len(internal) == 0 || internal[0] != ip || len(internal) > 2 || !v6ok || hostname != "e2e-init" {
		t.Errorf("addresses = %v, want InternalIP %s (the DHCP lease), perhaps one in fd88::/64 (DHCPv6), and Hostname e2e-init", n.Status.Addresses, ip)
	}
}

// TestShutdownTaintFollowsDomainState: a Node whose domain stops gets
// node.kubernetes.io/out-of-service at once, while the Node is still
// Ready (the hypervisor's word is enough), and upstream's shutdown taint
// once it is NotReady; both go when the domain runs again.
func TestShutdownTaintFollowsDomainState(t *testing.T) {
	requireEnv(t)
	defineDomain(t, "e2e-stop", true)
	startCCM(t, libvirtCloudConfig())
	createNode(t, "e2e-stop", v1.ConditionTrue)
	waitNode(t, "e2e-stop", "initialization", 30*time.Second, func(n *v1.Node) bool { return n != nil && !hasTaint(n, uninitializedTaint) })

	d := domain(t, "e2e-stop")
	stopped := time.Now()
	if err := d.Destroy(); err != nil {
		t.Fatal(err)
	}
	n := waitNode(t, "e2e-stop", "out-of-service taint", 30*time.Second, func(n *v1.Node) bool { return n != nil && hasTaint(n, outofservice.TaintKey) })
	t.Logf("out-of-service taint %s after the domain stopped", time.Since(stopped).Round(time.Millisecond))
	if i := slices.IndexFunc(n.Spec.Taints, func(t v1.Taint) bool { return t.Key == outofservice.TaintKey }); n.Spec.Taints[i].Effect != v1.TaintEffectNoExecute {
		t.Errorf("out-of-service taint %+v, want NoExecute", n.Spec.Taints[i])
	}
	waitNodeEvent(t, "e2e-stop", outofservice.ReasonTainted)
	setReady(t, "e2e-stop", v1.ConditionFalse) // the kubelet stops reporting
	waitNode(t, "e2e-stop", "shutdown taint", 30*time.Second, func(n *v1.Node) bool { return n != nil && hasTaint(n, shutdownTaint) })

	if err := d.Create(); err != nil {
		t.Fatal(err)
	}
	setReady(t, "e2e-stop", v1.ConditionTrue)
	n = waitNode(t, "e2e-stop", "shutdown and out-of-service taints' removal", 30*time.Second, func(n *v1.Node) bool {
		return n != nil && !hasTaint(n, shutdownTaint) && !hasTaint(n, outofservice.TaintKey)
	})
	if n.Spec.ProviderID == "" {
		t.Error("node lost its providerID")
	}
	waitNodeEvent(t, "e2e-stop", outofservice.ReasonUntainted)
}

// waitNodeEvent waits for an Event of reason on the Node.
func waitNodeEvent(t *testing.T, node, reason string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		evs, err := env.admin.CoreV1().Events("").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + node + ",reason=" + reason})
		if err == nil && len(evs.Items) > 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Errorf("no %s Event on Node %s", reason, node)
}

func TestUndefinedDomainDeletesNotReadyNode(t *testing.T) {
	requireEnv(t)
	defineDomain(t, "e2e-gone", true)
	defineDomain(t, "e2e-stays", false) // shut off: exists, must stay
	startCCM(t, libvirtCloudConfig())
	createNode(t, "e2e-gone", v1.ConditionTrue)
	createNode(t, "e2e-stays", v1.ConditionFalse)
	waitNode(t, "e2e-gone", "initialization", 30*time.Second, func(n *v1.Node) bool { return n != nil && n.Spec.ProviderID != "" })
	waitNode(t, "e2e-stays", "initialization", 30*time.Second, func(n *v1.Node) bool { return n != nil && n.Spec.ProviderID != "" })

	removeDomain("e2e-gone")
	setReady(t, "e2e-gone", v1.ConditionFalse)
	waitNode(t, "e2e-gone", "deletion", 30*time.Second, func(n *v1.Node) bool { return n == nil })
	if _, err := env.admin.CoreV1().Nodes().Get(context.Background(), "e2e-stays", metav1.GetOptions{}); err != nil {
		t.Fatalf("node of a shut-off domain was deleted: %v", err)
	}
}

func TestLibvirtdRestart(t *testing.T) {
	requireEnv(t)
	defineDomain(t, "e2e-a", true)
	c := startCCM(t, libvirtCloudConfig())
	createNode(t, "e2e-a", v1.ConditionTrue)
	waitNode(t, "e2e-a", "initialization", 30*time.Second, func(n *v1.Node) bool { return n != nil && n.Spec.ProviderID != "" })
	// NotReady: the lifecycle controller asks the cloud about it every
	// --node-monitor-period (5 s as shipped).
	setReady(t, "e2e-a", v1.ConditionFalse)

	env.daemon.StopLibvirtd()
	restarted := false
	defer func() {
		if !restarted {
			_ = env.daemon.StartLibvirtd(context.Background())
		}
	}()
	// A Node deleted now would be the CCM reading "unreachable" as "gone".
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := env.admin.CoreV1().Nodes().Get(context.Background(), "e2e-a", metav1.GetOptions{}); err != nil {
			t.Fatalf("node deleted while libvirtd was down: %v", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if !strings.Contains(c.proc.Tail(200), "hypervisor unavailable") {
		t.Fatalf("the CCM never reported the hypervisor unavailable; log tail:\n%s", c.proc.Tail(20))
	}
	if err := env.daemon.StartLibvirtd(context.Background()); err != nil {
		t.Fatal(err)
	}
	restarted = true
	var err error
	if env.virt, err = reconnect(); err != nil {
		t.Fatal(err)
	}

	// Served again, without a CCM restart: a new domain initializes, and
	// a lifecycle event (the old domain stopping) reaches the cache.
	uuid, _ := defineDomain(t, "e2e-b", true)
	createNode(t, "e2e-b", v1.ConditionTrue)
	n := waitNode(t, "e2e-b", "initialization after libvirtd restart", 60*time.Second, func(n *v1.Node) bool { return n != nil && n.Spec.ProviderID != "" })
	if n.Spec.ProviderID != "libvirt://"+uuid {
		t.Errorf("providerID = %q", n.Spec.ProviderID)
	}
	if err := domain(t, "e2e-a").Destroy(); err != nil {
		t.Fatal(err)
	}
	waitNode(t, "e2e-a", "shutdown taint after libvirtd restart", 30*time.Second, func(n *v1.Node) bool { return n != nil && hasTaint(n, shutdownTaint) })
	if c.proc.Exited() {
		t.Fatal("the CCM exited")
	}
}

func TestMalformedCloudConfigExits(t *testing.T) {
	requireEnv(t)
	for name, tc := range map[string]struct{ yaml, want string }{
		"wrong type":     {"region: [this, is, not, a, string]\n", "region"},
		"bad uri":        {"hypervisors: [{uri: 'nope'}]\n", `hypervisors[0].uri: "nope"`},
		"unknown field":  {"hypervisor: []\n", `unknown field "hypervisor"`},
		"unknown source": {"addressSources: [magic]\n", `addressSources[0]: "magic"`},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bad.yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(env.ccmBin, "--cloud-provider=libvirt", "--cloud-config="+path, "--kubeconfig="+env.cp.AdminKube)
			out, err := cmd.CombinedOutput()
			if err == nil || cmd.ProcessState.ExitCode() == 0 {
				t.Fatalf("exit 0 with a malformed config; output:\n%s", out)
			}
			// klog quotes the error, escaping its quotes.
			if !strings.Contains(strings.ReplaceAll(string(out), `\"`, `"`), tc.want) {
				t.Fatalf("output does not name %q:\n%s", tc.want, out)
			}
		})
	}
}
