package controlplane

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
)

// Process is a child process whose output goes to a log file.
type Process struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
	once sync.Once
}

// StartProcess starts bin with args, output to logPath. The process is
// killed when ctx ends or this process dies; Stop ends it gently first.
func StartProcess(ctx context.Context, logPath, bin string, args ...string) (*Process, error) {
	return startCommand(ctx, logPath, exec.Command(bin, args...), false)
}

// StartDaemon starts bin like StartProcess but in a session of its own that
// outlives this process (the lab's daemons outlive `labcloud up`).
func StartDaemon(logPath, bin string, args ...string) (*Process, error) {
	return startCommand(context.Background(), logPath, exec.Command(bin, args...), true)
}

// StartDaemonCommand is StartDaemon for a prepared command (extra files,
// environment); its Stdout and Stderr are set to the log.
func StartDaemonCommand(logPath string, cmd *exec.Cmd) (*Process, error) {
	return startCommand(context.Background(), logPath, cmd, true)
}

func startCommand(ctx context.Context, logPath string, cmd *exec.Cmd, daemon bool) (*Process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so a stop reaches its children too; unless it
	// is a daemon, it dies with us if we are killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if daemon {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	if err := spawn(cmd); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	p := &Process{Name: filepath.Base(cmd.Path), Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	go func() {
		select {
		case <-ctx.Done():
			p.Stop()
		case <-p.done:
		}
	}()
	return p, nil
}

// spawner forks every child from one OS thread that never exits. Linux
// delivers Pdeathsig when the *thread* that forked a child exits, and Go
// ends a thread whose goroutine exits while locked to it — which namespace
// work does (runtime.LockOSThread + setns). Without this, a test switching
// namespaces could SIGKILL a libvirtd started from a pooled thread.
var (
	spawnOnce sync.Once
	spawnCh   chan spawnRequest
)

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range spawnCh {
				r.done <- r.cmd.Start()
			}
		}()
	})
	r := spawnRequest{cmd: cmd, done: make(chan error, 1)}
	spawnCh <- r
	return <-r.done
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait waits for the process to end and returns its exit code.
func (p *Process) Wait() int {
	<-p.done
	return p.cmd.ProcessState.ExitCode()
}

// Stop sends SIGTERM to the process group, then SIGKILL after 10 s.
func (p *Process) Stop() {
	p.once.Do(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	})
}

// Kill ends the process at once with SIGKILL (a crash, for tests).
func (p *Process) Kill() {
	p.once.Do(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	})
}

// Tail returns the last n lines of the log.
func (p *Process) Tail(n int) string {
	data, err := os.ReadFile(p.Log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// PeakRSS is the process's peak resident set size in bytes (VmHWM).
func (p *Process) PeakRSS() (int64, error) {
	proc, err := procfs.NewProc(p.Pid())
	if err != nil {
		return 0, err
	}
	st, err := proc.NewStatus()
	if err != nil {
		return 0, err
	}
	return int64(st.VmHWM), nil
}
