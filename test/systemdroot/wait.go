package systemdroot

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// waitLeader finds the container's systemd: nspawn's child once it has
// exec'd systemd (before that the child is still a copy of nspawn).
func (m *Machine) waitLeader(ctx context.Context) error {
	pid := m.cmd.Process.Pid
	for {
		for _, c := range children(pid) {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", c)); strings.TrimSpace(string(comm)) == "systemd" {
				m.leader = c
				m.pidNS, _ = os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", c))
				return nil
			}
		}
		if err := m.pause(ctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("boot %s: waiting for systemd to start: %w", m.Name, err)
		}
	}
}

// waitRunning polls systemctl is-system-running --wait, which fails while
// systemd's bus is not up yet and blocks while it is starting.
func (m *Machine) waitRunning(ctx context.Context) error {
	var last string
	for {
		out, _ := m.Exec(ctx, "systemctl", "is-system-running", "--wait")
		fields := strings.Fields(out)
		if len(fields) > 0 {
			last = fields[len(fields)-1]
		}
		if last == "running" || last == "degraded" {
			return nil
		}
		if err := m.pause(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("boot %s: is-system-running says %q: %w", m.Name, last, err)
		}
	}
}

// pause sleeps d, failing early if ctx ends or nspawn exits.
func (m *Machine) pause(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w; console: %s", ctx.Err(), m.logTail())
	case <-m.done:
		return fmt.Errorf("systemd-nspawn exited: %v; console: %s", m.waitErr, m.logTail())
	case <-time.After(d):
		return nil
	}
}

func (m *Machine) logTail() string {
	b, _ := os.ReadFile(m.logPath)
	return tail(b)
}

// children lists pid's child processes.
func children(pid int) []int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}
