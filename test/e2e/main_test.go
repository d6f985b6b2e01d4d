// Package e2e runs the real CCM binary against a real control plane
// (etcd, kube-apiserver, kube-controller-manager built from the module
// proxy) and a real libvirtd with real QEMU domains, all inside a network
// namespace this test creates. Run as root: `make e2e`.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/internal/e2etest"
	"github.com/labcloud/labcloud/lab/controlplane"
	"github.com/labcloud/labcloud/lab/libvirtd"
	"github.com/labcloud/labcloud/test/systemdroot"
)

const netnsEnv = "LABCLOUD_E2E_NETNS"

// env is the shared environment: one control plane, one libvirtd, one
// libvirt network, the CCM binary. Tests start their own CCM processes.
var env struct {
	skip    string // why the suite cannot run here, if it cannot
	dir     string
	tools   string
	ccmBin  string
	cp      *controlplane.ControlPlane
	daemon  *libvirtd.Daemon
	admin   kubernetes.Interface
	virt    *libvirt.Connect
	repo    string
	network string
	bridge  string
	// auditLog records every write the CCM's identity makes to the API
	// server (auditPolicy), for the steady-state benchmark.
	auditLog string

	ccmMu sync.Mutex
	ccms  []*ccm // started by startCCM and not yet cleaned up
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		env.skip = "e2e tests need root (network namespace, libvirtd, QEMU); run `sudo make e2e`"
		return m.Run()
	}
	tools, err := controlplane.FindTools()
	if err != nil {
		env.skip = err.Error()
		if os.Getenv("CI") != "" {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
		return m.Run()
	}
	if os.Getenv(netnsEnv) == "" {
		// The namespace has no way out: build the package's systemd root
		// (TestDebUnderSystemd) here, once per package list.
		if _, err := systemdroot.Root(context.Background(), "", nil); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: systemd root:", err)
		}
		return reexecInNetns()
	}
	code, err := setUpAndRun(m, tools)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		return 1
	}
	return code
}

// reexecInNetns runs this test binary again inside a fresh network
// namespace, so the bridge, routes and ARP traffic never touch the host.
func reexecInNetns() int {
	name := fmt.Sprintf("lc-e2e-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: ip netns add %s: %v: %s\n", name, err, out)
		return 1
	}
	defer func() {
		// Whatever the run left behind (it may have been killed by a
		// timeout): dnsmasq, QEMU, daemons. Then the namespace itself.
		if pids, err := exec.Command("ip", "netns", "pids", name).Output(); err == nil {
			for _, f := range strings.Fields(string(pids)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		_ = exec.Command("ip", "netns", "del", name).Run()
	}()
	args := append([]string{"netns", "exec", name, os.Args[0]}, os.Args[1:]...)
	cmd := exec.Command("ip", args...)
	cmd.Stdout, cmd.Stderr, cmd.Stdin = os.Stdout, os.Stderr, os.Stdin
	cmd.Env = append(os.Environ(), netnsEnv+"="+name)
	if err := cmd.Run(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	return 0
}

func setUpAndRun(m *testing.M, tools string) (int, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return 0, fmt.Errorf("lo up: %v: %s", err, out)
	}
	dir, err := os.MkdirTemp("", "labcloud-e2e-")
	if err != nil {
		return 0, err
	}
	env.dir, env.tools = dir, tools
	keep := os.Getenv("LABCLOUD_E2E_KEEP") != ""
	defer func() {
		if !keep {
			os.RemoveAll(dir)
		} else {
			fmt.Fprintln(os.Stderr, "e2e: logs kept in", dir)
		}
	}()
	env.repo = e2etest.RepoRoot()

	env.ccmBin = filepath.Join(dir, "libvirt-cloud-controller-manager")
	build := exec.Command("make", "-s", "build", "BIN="+dir)
	build.Dir = env.repo
	if out, err := build.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("make build: %v: %s", err, out)
	}

	release, err := libvirtd.Lock(ctx, func() {
		fmt.Fprintln(os.Stderr, "e2e: waiting for another e2e run to release the host's libvirtd")
	})
	if err != nil {
		return 0, err
	}
	defer release()
	env.daemon, err = libvirtd.Start(ctx, dir)
	if err != nil {
		return 0, err
	}
	defer env.daemon.Stop()
	if env.virt, err = libvirt.NewConnect("qemu:///system"); err != nil {
		return 0, fmt.Errorf("connect to libvirtd: %w", err)
	}
	// Domains persist in libvirt's configuration: a run that was killed
	// left its own behind, and a test defining one by the same name would
	// fail. The host lock says nobody else uses them.
	destroyAllDomains(env.virt)
	defer func() {
		destroyAllDomains(env.virt)
		env.virt.Close()
	}()
	env.network, env.bridge = "lce2e", "lce2ebr0"
	// Dual-stack, as the lab can be: IPv6 VIPs need a segment that carries
	// IPv6 (libvirt disables it on a bridge of an IPv4-only network).
	network := libvirtd.Network{Name: env.network, Bridge: env.bridge, IPv4Prefix: "10.88.0", DHCPFirst: 100, DHCPLast: 250,
		IPv6: &libvirtd.IPv6Net{Address: "fd88::1", Prefix: 64, DHCPFirst: "fd88::100", DHCPLast: "fd88::1ff"}}
	if err := network.Create(env.virt); err != nil {
		return 0, err
	}
	defer func() { // stops its dnsmasq; runs before destroyAllDomains above
		if n, err := env.virt.LookupNetworkByName(env.network); err == nil {
			_ = n.Destroy()
			n.Free()
		}
	}()

	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		return 0, err
	}
	env.auditLog = filepath.Join(dir, "audit.log")
	cpDir := filepath.Join(dir, "controlplane")
	env.cp, err = controlplane.Start(ctx, controlplane.Options{
		Tools:         tools,
		Dir:           cpDir,
		ClusterCIDR:   "10.244.0.0/16",
		ServiceCIDR:   "10.96.0.0/16,fd00:96::/108", // RequireDualStack Services need both
		APIServerArgs: []string{"--audit-policy-file", policy, "--audit-log-path", env.auditLog},
	})
	if err != nil {
		return 0, err
	}
	defer env.cp.Stop()
	cfg, err := clientcmd.BuildConfigFromFlags("", env.cp.AdminKube)
	if err != nil {
		return 0, err
	}
	cfg.QPS, cfg.Burst = 1000, 2000
	if env.admin, err = kubernetes.NewForConfig(cfg); err != nil {
		return 0, err
	}
	// The RBAC as shipped, applied from the file users apply.
	if out, err := kubectl("apply", "-f", filepath.Join(env.repo, "examples", "rbac.yaml")); err != nil {
		return 0, fmt.Errorf("apply examples/rbac.yaml: %v: %s", err, out)
	}
	start := time.Now()
	code := m.Run()
	fmt.Fprintf(os.Stderr, "e2e: suite ran %s\n", time.Since(start).Round(time.Millisecond))
	return code, nil
}

// auditPolicy logs the writes of the CCM's identity (examples/rbac.yaml's
// service account), with metadata only, and nothing else.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: ["system:serviceaccount:kube-system:cloud-controller-manager"]
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
`

func kubectl(args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(env.tools, "kubectl"), append([]string{"--kubeconfig", env.cp.AdminKube}, args...)...)
	return cmd.CombinedOutput()
}

// requireEnv skips (with the reason) when the suite cannot run here.
func requireEnv(t testing.TB) {
	t.Helper()
	if env.skip != "" {
		t.Skip(env.skip)
	}
}
