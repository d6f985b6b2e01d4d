package systemdroot

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Bind is a host path made visible in the container.
type Bind struct {
	Source   string // host path; bind a socket's directory rather than the socket, which a daemon restart replaces
	Target   string // container path; empty means the same as Source
	ReadOnly bool
}

// Options describe one boot.
type Options struct {
	Root         string        // a root from Root; it is not modified
	NetNS        string        // e.g. /run/netns/NAME; empty gives a private namespace with only lo
	Binds        []Bind        //
	Capabilities []string      // added to nspawn's default set, e.g. CAP_NET_ADMIN (dropped by default)
	LogFile      string        // console output; empty keeps it in the per-boot directory
	WorkDir      string        // parent of the per-boot directory; empty means os.TempDir()
	BootTimeout  time.Duration // until is-system-running says running or degraded; default 60s
	Copy         bool          // copy the root (cp -a --reflink=auto) instead of an overlay
}

// Machine is a booted container. Call Stop exactly when done with it.
type Machine struct {
	Name    string // nspawn's machine name
	Overlay bool   // whether the root is an overlay (else a copy)

	dir     string // per-boot directory: root, upper, work, maybe console.log
	root    string // the container's root as seen from the host
	logPath string
	log     *os.File
	lock    *os.File // see sweep.go
	cmd     *exec.Cmd
	done    chan struct{} // closed when nspawn has exited
	waitErr error
	leader  int    // the container's PID 1, in the host's PID namespace
	pidNS   string // its PID namespace, as /proc/PID/ns/pid reads

	stopOnce sync.Once
	stopErr  error
}

// Boot starts systemd-nspawn --boot on a fresh overlay (or copy) of
// opts.Root and returns once systemd inside reports running or degraded.
func Boot(ctx context.Context, opts Options) (m *Machine, err error) {
	if !isDir(filepath.Join(opts.Root, "usr/lib/systemd")) {
		return nil, fmt.Errorf("boot: %q is not a systemd root", opts.Root)
	}
	if err := InstallMissing(ctx, "systemd-container"); err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	if err := mountHostCgroups(); err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	if opts.BootTimeout == 0 {
		opts.BootTimeout = 60 * time.Second
	}
	var rnd [4]byte
	rand.Read(rnd[:])
	m = &Machine{Name: "sdr-" + hex.EncodeToString(rnd[:]), done: make(chan struct{})}
	if err := sweep(opts.WorkDir); err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	// Lock the per-boot directory before giving it the name sweep looks for.
	if m.dir, err = os.MkdirTemp(opts.WorkDir, ".systemdroot-new-"); err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, m.Stop())
		}
	}()
	if err := m.holdLock(); err != nil {
		return m, err
	}
	named := filepath.Join(filepath.Dir(m.dir), "systemdroot-"+m.Name)
	if err := os.Rename(m.dir, named); err != nil {
		return m, fmt.Errorf("boot: %w", err)
	}
	m.dir = named
	if err := m.prepareRoot(ctx, opts); err != nil {
		return m, err
	}
	if m.logPath = opts.LogFile; m.logPath == "" {
		m.logPath = filepath.Join(m.dir, "console.log")
	}
	if m.log, err = os.OpenFile(m.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644); err != nil {
		return m, fmt.Errorf("boot: console log: %w", err)
	}
	args, err := nspawnArgs(m, opts)
	if err != nil {
		return m, err
	}
	if err := m.start(args); err != nil {
		return m, err
	}
	pid := []byte(strconv.Itoa(m.cmd.Process.Pid))
	if err := os.WriteFile(filepath.Join(m.dir, pidName), pid, 0o644); err != nil {
		return m, fmt.Errorf("boot: %w", err)
	}

	ctx, cancel := context.WithTimeout(ctx, opts.BootTimeout)
	defer cancel()
	if err := m.waitLeader(ctx); err != nil {
		return m, err
	}
	if err := m.waitRunning(ctx); err != nil {
		return m, err
	}
	return m, nil
}

// prepareRoot mounts an overlay over opts.Root (or copies it) at m.dir/root.
func (m *Machine) prepareRoot(ctx context.Context, opts Options) error {
	m.root = filepath.Join(m.dir, "root")
	for _, d := range []string{"root", "upper", "work"} {
		if err := os.Mkdir(filepath.Join(m.dir, d), 0o755); err != nil {
			return fmt.Errorf("boot: %w", err)
		}
	}
	if !opts.Copy && !strings.ContainsAny(opts.Root+m.dir, ",:") {
		data := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s",
			opts.Root, filepath.Join(m.dir, "upper"), filepath.Join(m.dir, "work"))
		if err := unix.Mount("overlay", m.root, "overlay", 0, data); err == nil {
			m.Overlay = true
			return nil
		}
		// No overlayfs here (or not on this filesystem): fall back to a copy.
	}
	out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", opts.Root+"/.", m.root).CombinedOutput()
	if err != nil {
		return fmt.Errorf("boot: copy root: %w: %s", err, tail(out))
	}
	return nil
}

// start runs nspawn in its own process group (so a ^C to go test's group
// does not reach it) with SIGTERM as parent-death signal: if the test dies,
// nspawn powers the container off; a SIGKILLed nspawn would leave the
// container's systemd running. That signal follows the thread that forked,
// so a goroutine keeps that thread locked, and alive, until nspawn exits.
func (m *Machine) start(args []string) error {
	m.cmd = exec.Command("systemd-nspawn", args...)
	m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	started := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := m.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		m.waitErr = m.cmd.Wait()
		close(m.done)
	}()
	if err := <-started; err != nil {
		m.cmd = nil
		return fmt.Errorf("boot: start systemd-nspawn: %w", err)
	}
	return nil
}

func nspawnArgs(m *Machine, opts Options) ([]string, error) {
	args := []string{
		"--boot", "--directory=" + m.root, "--machine=" + m.Name,
		"--register=no", "--keep-unit", // no systemd on the host to register with
		"--private-users=no",
		"--link-journal=no", // keep the host's /var/log/journal out of it
		"--console=passive", // console output to our log, no input
		"--setenv=SYSTEMD_COLORS=0",
	}
	if opts.NetNS != "" {
		args = append(args, "--network-namespace-path="+opts.NetNS)
	} else {
		args = append(args, "--private-network")
	}
	if len(opts.Capabilities) > 0 {
		args = append(args, "--capability="+strings.Join(opts.Capabilities, ","))
	}
	for _, b := range opts.Binds {
		if !filepath.IsAbs(b.Source) || (b.Target != "" && !filepath.IsAbs(b.Target)) {
			return nil, fmt.Errorf("boot: bind %s:%s: paths must be absolute", b.Source, b.Target)
		}
		target := b.Target
		if target == "" {
			target = b.Source
		}
		flag := "--bind="
		if b.ReadOnly {
			flag = "--bind-ro="
		}
		args = append(args, flag+escapeBind(b.Source)+":"+escapeBind(target))
	}
	return args, nil
}

// escapeBind protects colons, which separate nspawn's bind fields.
func escapeBind(p string) string {
	return strings.NewReplacer(`\`, `\\`, `:`, `\:`).Replace(p)
}

// PID is the container's systemd as seen from the host.
func (m *Machine) PID() int { return m.leader }

// NspawnPID is the systemd-nspawn process.
func (m *Machine) NspawnPID() int { return m.cmd.Process.Pid }

// RootDir is the per-boot root on the host (overlay mount point or copy).
// Mounts made inside the container (/tmp, /run are tmpfs) are not in it.
func (m *Machine) RootDir() string { return m.root }
