package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Where the lab's processes write. Every daemon the lab starts writes its
// standard output and error to a file in the state directory; guests write
// their serial console (kernel, lab-init, containerd, kubelet, kube-proxy)
// to nodes/NAME.console.
func cpLog(dir, name string) string { return filepath.Join(dir, "controlplane", name+".log") }
func ccmLog(dir string) string      { return filepath.Join(dir, "ccm.log") }

// ccmReplicaLog, replicaCloudConfig and hostLibvirtdLog are a host's but
// the first's.
func ccmReplicaLog(dir, host string) string {
	return filepath.Join(dir, "ccm-"+host+".log")
}
func replicaCloudConfig(dir, host string) string {
	return filepath.Join(dir, "cloud-config-"+host+".yaml")
}
func hostLibvirtdLog(dir, host string) string {
	return filepath.Join(dir, "libvirtd-"+host+".log")
}

// The daemons up starts itself: their keys in State.Pids, and their logs
// in the state directory dir.
const (
	DNSPid       = "coredns"
	RegistryPid  = "registry"
	ForwarderPid = "apiserver-forwarder"
)

// DNSLog, RegistryLog, ForwarderLog and SimulatorLog are their logs.
func DNSLog(dir string) string       { return filepath.Join(dir, "coredns.log") }
func RegistryLog(dir string) string  { return filepath.Join(dir, "registry.log") }
func ForwarderLog(dir string) string { return filepath.Join(dir, "apiserver-forwarder.log") }
func SimulatorLog(dir string) string { return filepath.Join(dir, "simulator.log") }

// ConsoleLog is where guest node writes its serial console.
func ConsoleLog(dir, node string) string {
	return filepath.Join(dir, "nodes", node+".console")
}

// qemuLogDir is where libvirtd keeps each guest's QEMU log.
const qemuLogDir = "/var/log/libvirt/qemu"

// LogSource is one component of the lab and the file it writes.
type LogSource struct {
	Component string
	Aliases   []string
	Path      string
}

// LogSources lists the lab's components and their logs in start order:
// the control plane, CoreDNS (full lab), the CCM, libvirt's daemons and
// the image registry (full lab; then each other host's CCM replica and
// libvirtd) or the simulator
// (light lab), the API server forwarder, then each guest's console (full
// lab).
func LogSources(st *State) []LogSource {
	out := []LogSource{
		{Component: "etcd", Path: cpLog(st.Dir, "etcd")},
		{Component: "kube-apiserver", Path: cpLog(st.Dir, "kube-apiserver")},
		{Component: "kube-controller-manager", Path: cpLog(st.Dir, "kube-controller-manager")},
	}
	if !st.Light {
		out = append(out, LogSource{Component: "kube-scheduler", Path: cpLog(st.Dir, "kube-scheduler")},
			LogSource{Component: DNSPid, Path: DNSLog(st.Dir)})
	}
	out = append(out, LogSource{Component: "ccm", Aliases: []string{CCMProcess}, Path: ccmLog(st.Dir)})
	if st.Light {
		out = append(out, LogSource{Component: "simulator", Path: SimulatorLog(st.Dir)})
	} else {
		out = append(out,
			LogSource{Component: "libvirtd", Path: filepath.Join(st.Dir, "libvirtd.log")},
			LogSource{Component: "virtlogd", Path: filepath.Join(st.Dir, "virtlogd.log")},
			LogSource{Component: RegistryPid, Path: RegistryLog(st.Dir)})
		for _, h := range st.LabHosts()[1:] {
			out = append(out, LogSource{Component: "ccm-" + h.Name, Path: ccmReplicaLog(st.Dir, h.Name)},
				LogSource{Component: "libvirtd-" + h.Name, Path: hostLibvirtdLog(st.Dir, h.Name)})
		}
	}
	out = append(out, LogSource{Component: ForwarderPid, Path: ForwarderLog(st.Dir)})
	if !st.Light {
		for _, n := range st.Nodes {
			out = append(out, LogSource{Component: n, Path: ConsoleLog(st.Dir, n)})
		}
	}
	return out
}

// LogNames are the names `labcloud logs` accepts, aliases included.
func LogNames(st *State) []string {
	var out []string
	for _, s := range LogSources(st) {
		out = append(append(out, s.Component), s.Aliases...)
	}
	return out
}

// FindLog returns the log of component (or an alias of it).
func FindLog(st *State, component string) (LogSource, error) {
	for _, s := range LogSources(st) {
		if s.Component == component || slices.Contains(s.Aliases, component) {
			return s, nil
		}
	}
	return LogSource{}, fmt.Errorf("no component %q in this lab; want one of: %s", component, strings.Join(LogNames(st), ", "))
}

// CopyLog writes the file at path to w; with follow it then keeps writing
// what is appended (tail -f) until ctx ends, starting again from the top
// when the file is truncated, and waiting for a file that does not exist
// yet. It returns nil when ctx ends.
func CopyLog(ctx context.Context, path string, w io.Writer, follow bool, poll time.Duration) error {
	var (
		f   *os.File
		off int64
	)
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	for {
		if f == nil {
			var err error
			f, err = os.Open(path)
			if err != nil && (!follow || !errors.Is(err, os.ErrNotExist)) {
				return err
			}
			off = 0
		}
		if f != nil {
			if fi, err := f.Stat(); err == nil && fi.Size() < off {
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					return err
				}
				off = 0
			}
			n, err := io.Copy(w, f)
			off += n
			if err != nil {
				return err
			}
		}
		if !follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(poll):
		}
	}
}

// ExportLogFiles copies every log of the lab into dir: one file per
// component (COMPONENT.log), each guest's console and QEMU log under
// nodes/NAME/, and the lab's state and cloud config. Kubeconfigs, tokens
// and keys stay behind. It carries on past a missing file and returns what
// it could not copy.
func ExportLogFiles(st *State, dir string) error { return exportLogFiles(st, dir, qemuLogDir) }

func exportLogFiles(st *State, dir, qemuLogs string) error {
	var errs []error
	cp := func(src, dst string) {
		if err := copyFile(src, filepath.Join(dir, dst)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	for _, s := range LogSources(st) {
		if slices.Contains(st.Nodes, s.Component) {
			logs := qemuLogs
			if h, err := st.HostOfNode(s.Component); err == nil && h.Index > 1 {
				logs = filepath.Join(h.private(st.Dir).Root, "log", "qemu")
			}
			cp(s.Path, filepath.Join("nodes", s.Component, "console.log"))
			cp(filepath.Join(logs, s.Component+".log"), filepath.Join("nodes", s.Component, "qemu.log"))
			continue
		}
		cp(s.Path, s.Component+".log")
	}
	cp(statePath(st.Dir), "state.json")
	cp(ccmCloudConfig(st.Dir), "cloud-config.yaml")
	for _, h := range st.LabHosts()[1:] {
		cp(replicaCloudConfig(st.Dir, h.Name), filepath.Base(replicaCloudConfig(st.Dir, h.Name)))
	}
	return errors.Join(errs...)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return out.Close()
}

// ExportCluster writes what the API server and the host say into dir:
// Nodes, Services and Pods as YAML, the events (YAML and a table), and the
// lab status as JSON. It runs inside the lab's namespace and carries on
// past a failure, returning every one.
func ExportCluster(ctx context.Context, st *State, dir string) error {
	var errs []error
	kubectl := func(file string, args ...string) {
		cmd := exec.CommandContext(ctx, filepath.Join(st.Tools, "kubectl"), append([]string{"--kubeconfig", st.Kubeconfig, "--request-timeout=30s"}, args...)...)
		out, err := cmd.Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
			}
			errs = append(errs, fmt.Errorf("kubectl %s: %w", strings.Join(args, " "), err))
			return
		}
		if err := os.WriteFile(filepath.Join(dir, file), out, 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	kubectl("kubectl-get-nodes-svc-pods.yaml", "get", "nodes,svc,pods", "-A", "-o", "yaml")
	kubectl("events.yaml", "get", "events", "-A", "-o", "yaml")
	kubectl("events.txt", "get", "events", "-A", "-o", "wide", "--sort-by=.lastTimestamp")
	s, err := GetStatus(ctx, st)
	if err != nil {
		errs = append(errs, fmt.Errorf("status: %w", err))
	} else {
		data, _ := json.MarshalIndent(s, "", "  ")
		if err := os.WriteFile(filepath.Join(dir, "status.json"), append(data, '\n'), 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
