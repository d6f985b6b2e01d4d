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
)

// TestBootInQEMU builds the image with a freshly built lab-node, boots it
// under QEMU (TCG, user-mode networking that stays inside QEMU) with a node
// config pointing at an API server that does not exist, and follows the
// serial log: modules, DHCP, lab-node start, and lab-node retrying its
// registration without crashing.
func TestBootInQEMU(t *testing.T) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed (apt-get install qemu-system-x86): not booting the image")
	}
	kernel, err := FindKernel()
	if err != nil {
		t.Skipf("no guest kernel: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()

	labNode := filepath.Join(dir, "lab-node")
	start := time.Now()
	if err := BuildLabNode(ctx, ".", labNode); err != nil {
		t.Fatal(err)
	}
	t.Logf("built lab-node in %v", time.Since(start).Round(time.Millisecond))

	out := filepath.Join(dir, "image")
	start = time.Now()
	art, err := Build(ctx, Options{Kernel: kernel, LabNode: labNode, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(art.Initramfs)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built image in %v: kernel %s (%s), initramfs %.1f MiB, key %s",
		time.Since(start).Round(time.Millisecond), art.Kernel, art.KernelRelease, float64(fi.Size())/(1<<20), art.Key[:12])
	if art.Cached {
		t.Error("first build reported Cached")
	}
	start = time.Now()
	again, err := Build(ctx, Options{Kernel: kernel, LabNode: labNode, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("second build in %v (cached: %v)", time.Since(start).Round(time.Millisecond), again.Cached)
	if !again.Cached || again.Key != art.Key {
		t.Errorf("second build: cached %v key %s, want a cache hit with key %s", again.Cached, again.Key, art.Key)
	}

	const (
		nodeName = "lab-boot-test-1"
		token    = "boot-test-token-d41d8cd98f00b204"
		uuid     = "5A0E2D7C-4B1F-4E8A-9C3D-2F6B7A8C9D0E"
	)
	initrd := filepath.Join(dir, nodeName+".initrd")
	cfg := NodeConfig{NodeName: nodeName, APIServer: "https://10.0.2.2:1", CACertPEM: testCA(t), Token: token}
	if err := WriteNodeInitrd(initrd, art.Initramfs, cfg); err != nil {
		t.Fatal(err)
	}

	serial := filepath.Join(dir, "serial.log")
	cmd := exec.CommandContext(ctx, qemu,
		"-machine", "accel=tcg", "-m", "192", "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none", "-no-reboot",
		"-uuid", uuid,
		"-kernel", art.Kernel, "-initrd", initrd, "-append", Cmdline,
		"-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0",
		"-serial", "file:"+serial)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	// QEMU dies with the test process, even if the test binary is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	booted := time.Now()
	bootCtx, bootCancel := context.WithTimeout(ctx, 3*time.Minute)
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
		{"init started", regexp.MustCompile(`lab-init: \[[\d.]+\] starting`)},
		{"virtio_net loaded", regexp.MustCompile(`lab-init: \[[\d.]+\] loaded module virtio_net`)},
		{"DHCP lease", regexp.MustCompile(`lab-dhcp: \[([\d.]+)\] bound eth0 (10\.0\.2\.\d+)/24 router 10\.0\.2\.2`)},
		{"lab-node started", regexp.MustCompile(`"Starting lab-node" node="` + nodeName + `" apiServer="https://10.0.2.2:1" systemUUID="` + strings.ToLower(uuid) + `"`)},
		{"connection error", regexp.MustCompile(`"Unable to register node with the API server; retrying" err="create node ` + nodeName + `: .*connection refused"`)},
	}
	seen := map[string]time.Duration{}
	var match []string
	for _, s := range steps {
		for {
			log := readLog()
			if match = s.re.FindStringSubmatch(log); match != nil {
				break
			}
			if strings.Contains(log, "lab-node exited") {
				t.Fatalf("lab-node exited before %s.\nserial log:\n%s", s.what, log)
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

	// lab-node keeps retrying: wait for more attempts, and make sure it
	// neither crashed nor was restarted.
	retry := regexp.MustCompile(`Unable to register node with the API server; retrying`)
	deadline := time.Now().Add(20 * time.Second)
	for len(retry.FindAllString(readLog(), -1)) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("lab-node did not retry its registration.\nserial log:\n%s", readLog())
		}
		time.Sleep(200 * time.Millisecond)
	}
	log := readLog()
	for _, bad := range []string{"lab-node exited", "panic:", "Kernel panic", "failed to load module", token} {
		if strings.Contains(log, bad) {
			t.Errorf("serial log contains %q", bad)
		}
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("serial log:\n%s", log)
	}
	fmt.Fprintf(os.Stderr, "boot timing: virtio_net %v, DHCP lease %v, lab-node start %v, first connection error %v\n",
		seen["virtio_net loaded"].Round(100*time.Millisecond), seen["DHCP lease"].Round(100*time.Millisecond),
		seen["lab-node started"].Round(100*time.Millisecond), seen["connection error"].Round(100*time.Millisecond))
}
