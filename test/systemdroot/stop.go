package systemdroot

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	poweroffTimeout = 30 * time.Second
	killTimeout     = 10 * time.Second
)

// Stop powers the container off (SIGTERM to nspawn, which in --boot mode
// asks systemd for an orderly shutdown), kills it if that takes longer than
// 30 s, and removes the per-boot root. It is safe to call more than once.
func (m *Machine) Stop() error {
	m.stopOnce.Do(func() { m.stopErr = m.stop() })
	return m.stopErr
}

func (m *Machine) stop() error {
	var errs []error
	if m.cmd != nil {
		_ = m.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.done:
		case <-time.After(poweroffTimeout):
			// SIGKILL to the container's init kills its whole PID namespace;
			// killing only nspawn would leave the container running.
			if m.leader > 0 {
				_ = syscall.Kill(m.leader, syscall.SIGKILL)
			}
			_ = m.cmd.Process.Kill()
			select {
			case <-m.done:
				m.removeNspawnState()
				errs = append(errs, fmt.Errorf("stop %s: no poweroff within %v, killed", m.Name, poweroffTimeout))
				// The orphaned init's namespace dies after nspawn: wait for it.
				if err := m.waitEmpty(killTimeout); err != nil {
					return errors.Join(append(errs, err)...) // keep the root: it is in use
				}
			case <-time.After(killTimeout):
				errs = append(errs, fmt.Errorf("stop %s: systemd-nspawn %d survived SIGKILL", m.Name, m.cmd.Process.Pid))
				return errors.Join(errs...) // keep the root: it may still be in use
			}
		}
	}
	if m.log != nil {
		if err := m.log.Close(); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: console log: %w", m.Name, err))
		}
	}
	if err := removeAll(m.dir); err != nil {
		errs = append(errs, fmt.Errorf("stop %s: %w", m.Name, err))
	}
	if m.lock != nil {
		m.lock.Close() // after the removal, so that no sweep races it
	}
	return errors.Join(errs...)
}

// removeNspawnState removes what a killed nspawn leaves in /run: its mount
// propagation directory and its lock on the root directory's inode.
func (m *Machine) removeNspawnState() {
	_ = os.Remove(filepath.Join("/run/systemd/nspawn/propagate", m.Name))
	var st unix.Stat_t
	if unix.Stat(m.root, &st) == nil {
		_ = os.Remove(fmt.Sprintf("/run/systemd/nspawn/locks/inode-%d:%d", st.Dev, st.Ino))
	}
}

// waitEmpty waits until no live (non-zombie) process is left in the
// container's PID namespace.
func (m *Machine) waitEmpty(timeout time.Duration) error {
	if m.pidNS == "" {
		return nil
	}
	deadline := time.Now().Add(timeout)
	for {
		left := 0
		pids, _ := filepath.Glob("/proc/[0-9]*")
		for _, p := range pids {
			ns, _ := os.Readlink(p + "/ns/pid")
			if ns == m.pidNS && !zombie(p) {
				left++
			}
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stop %s: %d processes left in the container after SIGKILL", m.Name, left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// zombie reads the state after "(comm)" in /proc/PID/stat.
func zombie(proc string) bool {
	stat, _ := os.ReadFile(proc + "/stat")
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}
