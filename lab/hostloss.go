package lab

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/labcloud/labcloud/lab/host"
)

// LoseHost takes host name (any but the first, which runs the control
// plane) off the lab as a power cut would: its LAN port goes down first, so
// that no TCP FIN or BFD packet leaves it again, then its CCM replica, its
// libvirtd and virtlogd and its guests' QEMUs are frozen (SIGSTOP). Nothing
// closes a connection, as nothing does when a host loses power: the other
// hosts' replicas notice through libvirt's keepalive and BFD. Its
// directories, network and domain definitions stay for RestoreHost.
func LoseHost(st *State, name string) error {
	h, err := st.otherHost(name)
	if err != nil {
		return err
	}
	if out, err := exec.Command("ip", "-n", h.Netns, "link", "set", HostUplink, "down").CombinedOutput(); err != nil {
		return fmt.Errorf("%s's LAN port down: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	h.signalAll(st, syscall.SIGSTOP)
	h.Lost = true
	return st.Save()
}

// signalAll sends sig to everything host h runs: its CCM replica, its
// libvirtd (with tini and virtlogd) and its guests' QEMUs.
func (h *Host) signalAll(st *State, sig syscall.Signal) {
	send := func(pid int, program string) {
		if pid > 0 && host.IsProcess(pid, program) {
			_ = syscall.Kill(pid, sig)
		}
	}
	send(h.Pids[CCMProcess], CCMProcess)
	h.private(st.Dir).Signal(sig)
	send(h.Pids["libvirtd"], "tini")
	qemus := host.QEMUs(NodePrefix)
	for _, n := range st.Nodes {
		if on, _ := st.HostOfNode(n); on.Name == h.Name {
			if pid, err := host.OneQEMU(qemus, n); err == nil {
				send(pid, "qemu-system")
			}
		}
	}
}

// RestoreHost brings a lost host back as from a power cut: what LoseHost
// froze is killed, then its libvirtd starts with its network and domains
// as they were, its guests start, its LAN port comes up and its CCM
// replica starts with the command up gave it. It records the new pids.
func RestoreHost(ctx context.Context, st *State, name string) error {
	h, err := st.otherHost(name)
	if err != nil {
		return err
	}
	h.signalAll(st, syscall.SIGKILL)
	h.Lost = false
	time.Sleep(killSettle)
	p, err := h.private(st.Dir).Restart(ctx, hostLibvirtdLog(st.Dir, h.Name))
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	h.Pids["libvirtd"] = p.Pid()
	var errs []error
	for _, n := range st.Nodes {
		if on, _ := st.HostOfNode(n); on.Name == name {
			errs = append(errs, host.StartDomain(h.URI, n))
		}
	}
	// A host back from a power cut has forgotten its neighbours; this one
	// remembers them as unreachable, which would fail connections at once.
	for _, args := range [][]string{{"neigh", "flush", "dev", Bridge}, {"link", "set", HostUplink, "up"}} {
		if out, err := exec.Command("ip", append([]string{"-n", h.Netns}, args...)...).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%s: ip %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out))))
		}
	}
	pid, err := launchReplica(ctx, h, st.Dir)
	if err != nil {
		errs = append(errs, fmt.Errorf("%s's CCM: %w", name, err))
	} else {
		h.Pids[CCMProcess] = pid
	}
	return errors.Join(append(errs, st.Save())...)
}

// launchReplica starts h's CCM replica, again every replicaRestart until
// it stays up, as the shipped unit's Restart=always does: a replica that
// starts before its host's LAN carries traffic exits at once.
func launchReplica(ctx context.Context, h *Host, stateDir string) (int, error) {
	var err error
	for range 15 {
		var pid int
		if pid, err = launchCCM(h.CCMCommand, h.Netns, ccmReplicaLog(stateDir, h.Name)); err == nil {
			return pid, nil
		}
		select {
		case <-ctx.Done():
			return 0, errors.Join(err, ctx.Err())
		case <-time.After(replicaRestart):
		}
	}
	return 0, err
}

// killSettle lets SIGKILLed processes end (and free their sockets and
// locks) before their successors start.
const killSettle = 200 * time.Millisecond

// replicaRestart is the shipped unit's RestartSec.
const replicaRestart = 2 * time.Second

// otherHost is the lab's host named name, if it is not the first.
func (s *State) otherHost(name string) (*Host, error) {
	h, err := s.hostNamed(name)
	if err == nil && h.Index == 1 {
		err = fmt.Errorf("host %q runs the control plane: only the others can be lost", name)
	}
	return h, err
}

// hostNamed is the lab's host named name, in the state (changes to it are
// saved with the state).
func (s *State) hostNamed(name string) (*Host, error) {
	hosts := s.LabHosts()
	var names []string
	for i := range hosts {
		if hosts[i].Name == name {
			return &hosts[i], nil
		}
		names = append(names, hosts[i].Name)
	}
	return nil, fmt.Errorf("host %q: not a host of this lab (%s)", name, strings.Join(names, ", "))
}
