package image

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// SeedDir is where the root disk keeps a containerd root with the images
// already imported and unpacked; at boot a node copies its small state
// into its tmpfs /var/lib/containerd and mounts the content blobs and
// unpacked layers from here (lab-init's rc): far faster under TCG than
// importing the images there (hashing and unpacking them in emulation).
const SeedDir = "/var/lib/containerd-seed"

// SeedContainerd runs the built containerd on this machine with root as its
// root directory, imports the image archives tars into the k8s.io
// namespace (the CRI's), checks that refs are there, and stops it: a
// guest's containerd given that directory finds the images imported and
// unpacked.
func SeedContainerd(ctx context.Context, tools string, tars, refs []string, root string) error {
	state, err := os.MkdirTemp("", "labcloud-seed-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(state)
	sock := filepath.Join(state, "containerd.sock")
	cfg := filepath.Join(state, "config.toml")
	err = os.WriteFile(cfg, fmt.Appendf(nil, "version = 3\nroot = %q\nstate = %q\n[grpc]\n  address = %q\n"+
		"[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = %q\n", root, state, sock, PauseImage), 0o600)
	if err != nil {
		return err
	}
	var log strings.Builder
	daemon := exec.CommandContext(ctx, filepath.Join(tools, "containerd"), "--config", cfg)
	daemon.Stdout, daemon.Stderr = &log, &log
	daemon.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := daemon.Start(); err != nil {
		return fmt.Errorf("start containerd to seed the root disk: %w", err)
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		_ = daemon.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- daemon.Wait() }()
		select {
		case <-done:
			return nil
		case <-time.After(20 * time.Second):
			_ = daemon.Process.Kill()
			<-done
			return fmt.Errorf("containerd did not stop within 20 s:\n%s", log.String())
		}
	}
	defer stop()
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		fi, err := os.Stat(sock)
		return err == nil && fi.Mode()&os.ModeSocket != 0, nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		return fmt.Errorf("containerd did not listen on %s within 20 s:\n%s", sock, log.String())
	}
	if len(tars) == 0 {
		return fmt.Errorf("no image archives to seed %s with", root)
	}
	ctr := filepath.Join(tools, "ctr")
	for _, tar := range tars {
		out, err := exec.CommandContext(ctx, ctr, "--address", sock, "--namespace", "k8s.io", "images", "import", tar).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr images import %s: %w: %s", tar, err, out)
		}
	}
	out, err := exec.CommandContext(ctx, ctr, "--address", sock, "--namespace", "k8s.io", "images", "list", "--quiet").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr images list: %w: %s", err, out)
	}
	for _, ref := range refs {
		if !strings.Contains(string(out), ref) {
			return fmt.Errorf("seeded containerd lacks %s (has: %s)", ref, out)
		}
	}
	return stop()
}
