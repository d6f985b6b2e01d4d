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
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/nodeagent"
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
	cmd.Dir = repoRoot()
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

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
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
	for pkg, cgo := range map[string]string{"./cmd/labcloud": "1", "./cmd/libvirt-cloud-controller-manager": "1", "./cmd/lab-node": "0"} {
		cmd := exec.Command("go", "build", "-o", bin+"/", pkg)
		cmd.Dir = repoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
	}
	l := &labcloud{t: t, bin: filepath.Join(bin, "labcloud"), dir: filepath.Join(t.TempDir(), "lab")}
	t.Cleanup(func() {
		if out, err := l.run(5*time.Minute, "down"); err != nil {
			t.Errorf("labcloud down: %v\n%s", err, out)
		}
	})
	return l
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

func TestLab(t *testing.T) {
	l := newLabcloud(t)
	start := time.Now()
	// Most of a long up is waiting for e2e runs to release the host's libvirtd.
	out := l.must(30*time.Minute, "up", "--nodes", "2")
	t.Logf("labcloud up --nodes 2 took %s:\n%s", time.Since(start).Round(100*time.Millisecond), out)

	// Nodes initialized from libvirt, with DHCP-lease addresses, pod CIDRs and routes.
	s := l.status()
	if len(s.Nodes) != 2 {
		t.Fatalf("status shows %d nodes, want 2: %+v", len(s.Nodes), s.Nodes)
	}
	podAddr, internalIP := map[string]string{}, map[string]string{}
	for _, n := range s.Nodes {
		if !strings.HasPrefix(n.ProviderID, "libvirt://") || n.Ready != "True" || n.DomainState != "running" {
			t.Errorf("node %s not initialized/ready/running: %+v", n.Name, n)
		}
		hasLease := false
		for _, a := range n.Addresses {
			if ip, ok := strings.CutPrefix(a, "InternalIP="); ok && strings.HasPrefix(ip, "10.123.0.1") {
				hasLease, internalIP[n.Name] = true, ip
			}
		}
		if !hasLease {
			t.Errorf("node %s has no InternalIP from the lab's DHCP range: %v", n.Name, n.Addresses)
		}
		if n.PodCIDR == "" || !strings.Contains(n.Route, "proto 76") {
			t.Errorf("node %s: pod CIDR %q route %q", n.Name, n.PodCIDR, n.Route)
		}
		podAddr[n.Name] = strings.TrimSuffix(n.PodCIDR, "0/24") + "1"
	}
	// Each node's pod address answers from the lab namespace (through the route).
	for name, addr := range podAddr {
		eventually(t, "ping "+name+"'s pod address "+addr, time.Minute, time.Second, func() string {
			if out, err := l.run(10*time.Second, "exec", "--", "busybox", "ping", "-c", "1", "-W", "2", addr); err != nil {
				return out
			}
			return ""
		})
	}
	// ... and from every other node: lab-node's probe on node A fetches
	// node B's probe at B's pod address (guest A -> host gateway -> pod-CIDR
	// route -> guest B), which answers with B's name.
	for a, aIP := range internalIP {
		for b, bPod := range podAddr {
			if a == b {
				continue
			}
			url := fmt.Sprintf("http://%s:%d/reach?addr=%s", aIP, nodeagent.ProbePort, bPod)
			eventually(t, a+" reaches "+b+"'s pod address "+bPod, time.Minute, time.Second, func() string {
				out, err := l.run(10*time.Second, "exec", "--", "curl", "-sS", "--max-time", "5", url)
				if got := strings.TrimSpace(out); err != nil || got != b {
					return fmt.Sprintf("curl %s: %q %v", url, out, err)
				}
				return ""
			})
			t.Logf("%s (%s) reaches %s's pod address %s", a, aIP, b, bPod)
		}
	}

	// A LoadBalancer VIP answers HTTP with a node name.
	l.must(time.Minute, "exec", "--", "kubectl", "create", "service", "loadbalancer", "web", "--tcp=80:80")
	var vip, first string
	eventually(t, "VIP answers HTTP", 2*time.Minute, 500*time.Millisecond, func() string {
		for _, svc := range l.status().Services {
			if svc.Service == "default/web" {
				vip = svc.VIP
			}
		}
		if vip == "" {
			return "no VIP yet"
		}
		out, err := l.run(10*time.Second, "exec", "--", "curl", "-s", "--max-time", "2", "http://"+vip+"/")
		first = strings.TrimSpace(out)
		if err != nil || podAddr[first] == "" {
			return fmt.Sprintf("curl %s: %q %v", vip, out, err)
		}
		return ""
	})

	// Stopping the answering node's domain moves the VIP.
	stopped := time.Now()
	l.must(time.Minute, "node", "stop", first)
	var second string
	eventually(t, "VIP moves off "+first, 60*time.Second, 100*time.Millisecond, func() string {
		out, _ := l.run(5*time.Second, "exec", "--", "curl", "-s", "--max-time", "1", "http://"+vip+"/")
		second = strings.TrimSpace(out)
		if podAddr[second] == "" || second == first {
			return fmt.Sprintf("answered %q", second)
		}
		return ""
	})
	t.Logf("VIP %s failover %s -> %s: %.3fs (domain stop -> first HTTP answer from the other node)", vip, first, second, time.Since(stopped).Seconds())

	// The stopped node gets the shutdown taint (once it is NotReady).
	eventually(t, first+" gets the shutdown taint", 3*time.Minute, time.Second, func() string {
		for _, n := range l.status().Nodes {
			if n.Name == first {
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
	// Deleting its domain deletes the Node.
	l.must(time.Minute, "node", "delete", first)
	eventually(t, first+" Node deleted", 2*time.Minute, time.Second, func() string {
		for _, n := range l.status().Nodes {
			if n.Name == first {
				return "still there"
			}
		}
		return ""
	})

	// down removes everything, twice.
	st, err := lab.LoadState(l.dir)
	if err != nil {
		t.Fatal(err)
	}
	l.downTwiceLeavesNothing(st.Pids)
	if out, err := exec.Command("pgrep", "-f", "guest="+lab.NodePrefix).Output(); err == nil {
		t.Errorf("QEMU processes of lab guests left behind: %s", out)
	}
}
