package image

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/labcloud/labcloud/lab/controlplane"
)

// TestBootInQEMU builds the boot initramfs and the node root disk from the
// built tools and a fresh lab-node, boots them under QEMU (TCG, user-mode
// networking that stays inside QEMU) with node files pointing at an API
// server that does not exist, and follows the serial log: root disk, DHCP,
// containerd seeded with the images, and kubelet trying to register.
func TestBootInQEMU(t *testing.T) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed (apt-get install qemu-system-x86): not booting the image")
	}
	kernel, err := FindKernel()
	if err != nil {
		t.Skipf("no guest kernel: %v", err)
	}
	tools, err := controlplane.FindTools()
	if err != nil {
		t.Skipf("no built tools (kubelet, containerd, ...): %v; run make tools", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()

	// A static lab-node, as make build makes it.
	labNode := filepath.Join(dir, "lab-node")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", labNode, "github.com/labcloud/labcloud/cmd/lab-node")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build lab-node: %v: %s", err, b)
	}
	out := filepath.Join(dir, "image")
	start := time.Now()
	art, err := Build(ctx, Options{Kernel: kernel, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	again, err := Build(ctx, Options{Kernel: kernel, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	if art.Cached || !again.Cached || again.Key != art.Key {
		t.Errorf("builds: first cached %v, second cached %v (keys %s, %s); want a miss, then a hit", art.Cached, again.Cached, art.Key, again.Key)
	}
	disk, err := BuildRootDisk(ctx, DiskOptions{Tools: tools, LabNode: labNode, KernelRelease: art.KernelRelease, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built initramfs and root disk in %v", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	disk2, err := BuildRootDisk(ctx, DiskOptions{Tools: tools, LabNode: labNode, KernelRelease: art.KernelRelease, Out: out})
	if err != nil || !disk2.Cached || disk2.Key != disk.Key {
		t.Errorf("second root disk build: %+v %v; want a cache hit with key %s", disk2, err, disk.Key)
	}
	t.Logf("root disk cache check in %v", time.Since(start).Round(time.Millisecond))

	const (
		nodeName = "lab-boot-test-1"
		token    = "boot-test-token-d41d8cd98f00b204"
		uuid     = "5A0E2D7C-4B1F-4E8A-9C3D-2F6B7A8C9D0E"
	)
	kubeconfig := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://10.0.2.2:1\", insecure-skip-tls-verify: true}}]\n"+
		"users: [{name: u, user: {token: %s}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n", token)
	files := []NodeFile{
		{Path: "/etc/hostname", Mode: 0o644, Data: []byte(nodeName + "\n")},
		{Path: "/etc/kubernetes/kubelet.conf", Mode: 0o600, Data: []byte(kubeconfig)},
		{Path: "/var/lib/kubelet/config.yaml", Mode: 0o644, Data: []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n" +
			"cgroupDriver: cgroupfs\ncontainerRuntimeEndpoint: unix:///run/containerd/containerd.sock\nfailSwapOn: false\n")},
		{Path: "/var/lib/kube-proxy/kubeconfig", Mode: 0o600, Data: []byte(kubeconfig)},
		{Path: "/var/lib/kube-proxy/config.yaml", Mode: 0o644, Data: []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" +
			"clientConnection: {kubeconfig: /var/lib/kube-proxy/kubeconfig}\n")},
	}
	initrd := filepath.Join(dir, nodeName+".initrd")
	if err := WriteNodeInitrd(initrd, art.Initramfs, files); err != nil {
		t.Fatal(err)
	}

	serial := filepath.Join(dir, "serial.log")
	cmd := exec.CommandContext(ctx, qemu,
		"-machine", "accel=tcg", "-cpu", "max", "-m", "1024", "-smp", "2",
		"-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none", "-no-reboot",
		"-uuid", uuid,
		"-kernel", art.Kernel, "-initrd", initrd, "-append", Cmdline,
		"-drive", "file="+disk.Path+",if=virtio,format=raw,readonly=on",
		"-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0",
		"-serial", "file:"+serial)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	// QEMU dies with the test process, even if the test binary is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	booted := time.Now()
	bootCtx, bootCancel := context.WithTimeout(ctx, 5*time.Minute)
	defer bootCancel()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start qemu: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	readLog := func() string {
		b, _ := os.ReadFile(serial)
		return string(b)
	}
	// Each step waits for a pattern in the serial log, in order.
	steps := []struct {
		what string
		re   *regexp.Regexp
	}{
		{"boot init started", regexp.MustCompile(`lab-boot: \[[\d.]+\] starting`)},
		{"root disk mounted", regexp.MustCompile(`lab-boot: \[[\d.]+\] root disk mounted`)},
		{"DHCP lease", regexp.MustCompile(`lab-dhcp: \[([\d.]+)\] bound eth0 (10\.0\.2\.\d+)/24 router 10\.0\.2\.2`)},
		{"containerd seeded", regexp.MustCompile(`lab-init: \[[\d.]+\] containerd root seeded`)},
		{"containerd started", regexp.MustCompile(`lab-init: \[[\d.]+\] starting containerd`)},
		{"kubelet registering", regexp.MustCompile(`kubelet: .*"Unable to register node with API server".*10\.0\.2\.2:1`)},
	}
	seen := map[string]time.Duration{}
	var match []string
	for _, s := range steps {
		for {
			log := readLog()
			if match = s.re.FindStringSubmatch(log); match != nil {
				break
			}
			if strings.Contains(log, "Kernel panic") {
				t.Fatalf("kernel panic before %s.\nserial log:\n%s", s.what, log)
			}
			select {
			case err := <-exited:
				exited <- err
				t.Fatalf("QEMU exited (%v) before %s.\nstderr: %s\nserial log:\n%s", err, s.what, stderr.String(), readLog())
			case <-bootCtx.Done():
				t.Fatalf("timed out waiting for %s.\nserial log:\n%s", s.what, readLog())
			case <-time.After(100 * time.Millisecond):
			}
		}
		seen[s.what] = time.Since(booted)
		if s.what == "DHCP lease" {
			t.Logf("guest got %s at guest uptime %ss", match[2], match[1])
		}
		t.Logf("%-18s after %v", s.what, seen[s.what].Round(100*time.Millisecond))
	}

	log := readLog()
	for _, bad := range []string{"containerd exited", "kubelet exited", "panic:", "Kernel panic", "failed to load module", "import failed", token} {
		if strings.Contains(log, bad) {
			t.Errorf("serial log contains %q", bad)
		}
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("serial log:\n%s", log)
	}
	fmt.Fprintf(os.Stderr, "boot timing: root disk %v, DHCP lease %v, containerd %v, containerd seeded %v, kubelet registering %v\n",
		seen["root disk mounted"].Round(100*time.Millisecond), seen["DHCP lease"].Round(100*time.Millisecond),
		seen["containerd started"].Round(100*time.Millisecond), seen["containerd seeded"].Round(100*time.Millisecond),
		seen["kubelet registering"].Round(100*time.Millisecond))
}
