package systemdroot

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A live Machine holds an flock on lockName in its per-boot directory and
// records nspawn's PID in pidName. A test binary that dies without Stop
// (a timeout panic, SIGKILL) leaves its directory and overlay mount behind;
// nspawn itself gets SIGTERM (Pdeathsig) and powers the container off.
// The next Boot in the same WorkDir removes such leftovers.
const (
	lockName = "lock"
	pidName  = "nspawn.pid"
)

// holdLock takes the per-boot lock for the Machine's lifetime.
func (m *Machine) holdLock() error {
	f, err := os.OpenFile(filepath.Join(m.dir, lockName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return fmt.Errorf("boot: lock %s: %w", f.Name(), err)
	}
	m.lock = f
	return nil
}

// sweep removes per-boot directories under workDir whose owner is gone.
func sweep(workDir string) error {
	if workDir == "" {
		workDir = os.TempDir()
	}
	dirs, _ := filepath.Glob(filepath.Join(workDir, "systemdroot-*"))
	var errs []error
	for _, d := range dirs {
		if !abandoned(d) {
			continue
		}
		if err := removeAll(d); err != nil {
			errs = append(errs, fmt.Errorf("sweep abandoned boot: %w", err))
		}
	}
	return errors.Join(errs...)
}

// abandoned: nobody holds the lock and its nspawn has exited. Boot locks a
// directory before renaming it to systemdroot-*, so a free lock means a dead owner.
func abandoned(dir string) bool {
	f, err := os.Open(filepath.Join(dir, lockName))
	if err != nil {
		return false
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return false
	}
	b, _ := os.ReadFile(filepath.Join(dir, pidName))
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if strings.TrimSpace(string(comm)) == "systemd-nspawn" {
			return false // still powering the container off
		}
	}
	return true
}
