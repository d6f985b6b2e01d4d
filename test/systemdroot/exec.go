package systemdroot

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// containerEnv replaces the host's environment (GOPATH, a host PATH, ...)
// for commands run inside.
var containerEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root", "LANG=C.UTF-8", "TERM=dumb", "SYSTEMD_COLORS=0",
}

// Exec runs args inside the container (all its namespaces, root and working
// directory) and returns stdout and stderr combined. A non-zero exit is an
// error that names the command; the output is returned either way.
func (m *Machine) Exec(ctx context.Context, args ...string) (string, error) {
	if m.leader == 0 {
		return "", fmt.Errorf("exec %q in %s: container not running", args, m.Name)
	}
	nsargs := append([]string{"-t", fmt.Sprint(m.leader), "-a", "-r", "-w", "--"}, args...)
	cmd := exec.CommandContext(ctx, "nsenter", nsargs...)
	cmd.Env = containerEnv
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// nsenter forks to enter the PID namespace; kill its process group so
	// that a cancelled command does not live on inside.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A daemon started by the command may hold our pipe open: stop reading then.
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("exec %q in %s: %w: %s", strings.Join(args, " "), m.Name, err, tail(out.Bytes()))
	}
	return out.String(), err
}

// CopyIn copies the regular file hostPath to containerPath (its directory
// must exist), keeping the mode. It writes through the container's own mount
// table (/proc/PID/root), so tmpfs mounts such as /tmp and /run are honoured,
// and resolves the path as if chrooted there, so symlinks cannot escape.
func (m *Machine) CopyIn(hostPath, containerPath string) error {
	src, err := os.Open(hostPath)
	if err != nil {
		return fmt.Errorf("copy in: %w", err)
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return fmt.Errorf("copy in: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("copy in %s: not a regular file", hostPath)
	}
	rootPath := fmt.Sprintf("/proc/%d/root", m.leader)
	root, err := unix.Open(rootPath, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("copy in: open %s: %w", rootPath, err)
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, containerPath, &unix.OpenHow{
		Flags:   unix.O_WRONLY | unix.O_CREAT | unix.O_TRUNC | unix.O_CLOEXEC,
		Mode:    uint64(fi.Mode().Perm()),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return fmt.Errorf("copy in: create %s in %s: %w", containerPath, m.Name, err)
	}
	dst := os.NewFile(uintptr(fd), containerPath)
	_, err = io.Copy(dst, src)
	if err == nil {
		err = dst.Chmod(fi.Mode().Perm()) // O_CREAT's mode was masked by umask
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copy in %s to %s: %w", hostPath, containerPath, err)
	}
	return nil
}
