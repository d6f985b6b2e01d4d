package host

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
)

// Processes lists the processes whose arguments match.
func Processes(match func(args []string) bool) []int {
	var pids []int
	procs, _ := procfs.AllProcs()
	for _, p := range procs {
		if args, err := p.CmdLine(); err == nil && match(args) {
			pids = append(pids, p.PID)
		}
	}
	return pids
}

// ProcessWithCommand finds a process whose command line is cmd; 0 if none.
func ProcessWithCommand(cmd []string) int {
	if len(cmd) == 0 {
		return 0
	}
	if pids := Processes(func(args []string) bool { return slices.Equal(args, cmd) }); len(pids) > 0 {
		return pids[0]
	}
	return 0
}

// IsProcess checks that pid still runs the program we started (pids are
// reused).
func IsProcess(pid int, name string) bool {
	args := Cmdline(pid)
	return len(args) > 0 && strings.Contains(args[0], name)
}

// Cmdline is process pid's arguments; none if it has ended (or is a
// zombie).
func Cmdline(pid int) []string {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return nil
	}
	args, _ := p.CmdLine()
	return args
}

// ArgContains says whether one of args contains s.
func ArgContains(args []string, s string) bool {
	return slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, s) })
}

// Stop sends SIGTERM (and SIGCONT), then SIGKILL after 10 s, and returns
// once the process has ended (or 5 s after SIGKILL: one stuck in the
// kernel may never end).
func Stop(pid int) {
	if syscall.Kill(pid, syscall.SIGTERM) != nil {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGCONT) // a frozen process handles it too, as systemd does
	if waitEnded(pid, 10*time.Second) {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	waitEnded(pid, 5*time.Second)
}

// waitEnded waits until pid has ended or is a zombie, at most timeout.
func waitEnded(pid int, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil || zombie(pid) {
			return true
		}
	}
	return false
}

// KillAndWait sends sig to pid and waits until it has ended (SIGKILL
// after timeout).
func KillAndWait(pid int, sig syscall.Signal, timeout time.Duration) error {
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("signal %d to pid %d: %w", sig, pid, err)
	}
	deadline := time.Now().Add(timeout)
	for syscall.Kill(pid, 0) == nil && !zombie(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			deadline = time.Now().Add(timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func zombie(pid int) bool {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return true
	}
	stat, err := p.Stat()
	return err != nil || stat.State == "Z"
}

// Started is when process pid started, by the host's clock.
func Started(pid int) (time.Time, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return time.Time{}, err
	}
	stat, err := p.Stat()
	if err != nil {
		return time.Time{}, err
	}
	secs, err := stat.StartTime()
	if err != nil {
		return time.Time{}, err
	}
	return time.Unix(0, int64(secs*float64(time.Second))), nil
}

// RSSMiB is process pid's resident set in MiB.
func RSSMiB(pid int) (float64, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, err
	}
	st, err := p.NewStatus()
	if err != nil {
		return 0, err
	}
	return float64(st.VmRSS) / (1 << 20), nil
}

// GuestQEMUs lists the QEMU processes of guests whose names start with
// prefix.
func GuestQEMUs(prefix string) []int {
	var out []int
	for _, pids := range QEMUs(prefix) {
		out = append(out, pids...)
	}
	return out
}

// QEMUs maps each guest whose name starts with prefix to its QEMU
// processes, found by their command lines ("-name guest=NAME,...") in one
// pass over the processes, whichever libvirtd started them: each of a
// lab's hosts keeps its pid files in a runtime directory of its own.
func QEMUs(prefix string) map[string][]int {
	out := map[string][]int{}
	procs, _ := procfs.AllProcs()
	for _, p := range procs {
		args, err := p.CmdLine()
		if err != nil || !ArgContains(args, "qemu-system") {
			continue
		}
		for _, a := range args {
			if name, ok := strings.CutPrefix(a, "guest="); ok && strings.HasPrefix(name, prefix) {
				name, _, _ = strings.Cut(name, ",")
				out[name] = append(out[name], p.PID)
			}
		}
	}
	return out
}

// QEMUPid finds the QEMU process of guest (QEMUs).
func QEMUPid(guest string) (int, error) {
	return OneQEMU(QEMUs(guest), guest)
}

// OneQEMU is guest's one QEMU process among qemus (QEMUs).
func OneQEMU(qemus map[string][]int, guest string) (int, error) {
	switch pids := qemus[guest]; len(pids) {
	case 0:
		return 0, fmt.Errorf("no QEMU process of %s", guest)
	case 1:
		return pids[0], nil
	default:
		return 0, fmt.Errorf("%d QEMU processes of %s: %v", len(pids), guest, pids)
	}
}
