package libvirtd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/lab/controlplane"
	"github.com/labcloud/labcloud/lab/host"
)

// Private is a libvirtd of its own in a network namespace: another
// hypervisor host beside the host's libvirtd. In a mount namespace of its
// own, libvirt's runtime, state, log, cache and configuration directories
// are directories under Root, so its sockets, domains, networks and leases
// are apart from every other libvirtd's. Its guests' tap devices, bridge
// and dnsmasq live in Netns.
type Private struct {
	Root  string // its directories; a short path, for the socket's sake
	Netns string
	// SSH runs an sshd on port 22 beside libvirtd, in its mount and
	// network namespaces: a qemu+ssh:// client reaches this libvirtd
	// at libvirt's usual socket, as it reaches another host's. Root logs
	// in with a key GrantSSH made.
	SSH bool
}

// privateDirs are libvirt's directories and the names they have under Root.
var privateDirs = []struct{ name, mountpoint string }{
	{"run", "/run/libvirt"},
	{"lib", "/var/lib/libvirt"},
	{"log", "/var/log/libvirt"},
	{"cache", "/var/cache/libvirt"},
	{"etc", "/etc/libvirt"},
}

// privateStart binds the directories over libvirt's own, then runs
// virtlogd, sshd if it has a configuration (Private.SSH) and, under tini
// as for the host's libvirtd, libvirtd; each writes its pid under Root
// ($1), not to /run where the host's do. sshd needs an absolute path and
// its privilege-separation directory.
const privateStart = `set -e
r=$1
while read -r name mountpoint; do mount --bind "$r/$name" "$mountpoint"; done <<EOF
` + "%s" + `EOF
virtlogd -p "$r/virtlogd.pid" &
if [ -f "$r/sshd_config" ]; then mkdir -p /run/sshd; "$(command -v sshd)" -f "$r/sshd_config" -E "$r/sshd.log"; fi
exec tini -s -- libvirtd -p "$r/libvirtd.pid"
`

// Socket is its read-write socket, reachable from every mount namespace.
func (p Private) Socket() string { return filepath.Join(p.Root, "run", "libvirt-sock") }

// URI reaches it from anywhere on the machine.
func (p Private) URI() string { return "qemu+unix:///system?socket=" + p.Socket() }

// Start prepares its directories, with a copy of the host's configuration
// that defines no domain or network, and starts it as a daemon that
// outlives the caller, logging to log; it returns when libvirtd answers.
func (p Private) Start(ctx context.Context, log string) (*controlplane.Process, error) {
	if err := Prepare(); err != nil {
		return nil, err
	}
	if err := p.makeDirs(); err != nil {
		return nil, err
	}
	return p.launch(ctx, log)
}

// Restart starts it again after it was killed, with its domains and
// networks as they were (a transient network whose bridge and dnsmasq
// outlived it is taken up again).
func (p Private) Restart(ctx context.Context, log string) (*controlplane.Process, error) {
	for _, f := range []string{"libvirtd.pid", "virtlogd.pid", "sshd.pid", "run/libvirt-sock", "run/libvirt-sock-ro", "run/libvirt-admin-sock", "run/virtlogd-sock", "run/virtlogd-admin-sock"} {
		_ = os.Remove(filepath.Join(p.Root, f))
	}
	return p.launch(ctx, log)
}

func (p Private) launch(ctx context.Context, log string) (*controlplane.Process, error) {
	var binds strings.Builder
	for _, d := range privateDirs {
		if err := os.MkdirAll(d.mountpoint, 0o755); err != nil {
			return nil, err
		}
		fmt.Fprintf(&binds, "%s %s\n", d.name, d.mountpoint)
	}
	proc, err := controlplane.StartDaemon(log, "ip", "netns", "exec", p.Netns,
		"unshare", "--mount", "--propagation", "private", "sh", "-c", fmt.Sprintf(privateStart, binds.String()), "sh", p.Root)
	if err != nil {
		return nil, err
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		if proc.Exited() {
			return false, errors.New("exited")
		}
		c, err := libvirt.NewConnect(p.URI())
		if err != nil {
			return false, nil
		}
		c.Close()
		return true, nil
	})
	if err != nil {
		p.Stop()
		proc.Stop()
		return nil, fmt.Errorf("libvirtd in %s did not start (%v); last log lines:\n%s", p.Netns, err, proc.Tail(10))
	}
	return proc, nil
}

// makeDirs makes Root's directories, etc a copy of /etc/libvirt without
// the host's domains and networks.
func (p Private) makeDirs() error {
	for _, d := range []string{"run", "lib/qemu", "lib/dnsmasq", "log/qemu", "cache"} {
		if err := os.MkdirAll(filepath.Join(p.Root, d), 0o755); err != nil {
			return err
		}
	}
	etc := filepath.Join(p.Root, "etc")
	_ = os.RemoveAll(etc)
	if out, err := exec.Command("cp", "-a", "/etc/libvirt", etc).CombinedOutput(); err != nil {
		return fmt.Errorf("copy /etc/libvirt: %w: %s", err, out)
	}
	for _, defs := range []string{"qemu", "qemu/networks"} {
		dir := filepath.Join(etc, defs)
		_ = os.RemoveAll(filepath.Join(dir, "autostart"))
		xmls, _ := filepath.Glob(filepath.Join(dir, "*.xml"))
		for _, x := range xmls {
			if err := os.Remove(x); err != nil {
				return err
			}
		}
	}
	if p.SSH {
		return p.makeSSHD()
	}
	return nil
}

// Pids are its libvirtd's and virtlogd's, from their pid files; 0 for one
// that wrote none.
func (p Private) Pids() (libvirtd, virtlogd int) {
	return p.pid("libvirtd"), p.pid("virtlogd")
}

// pid is daemon's, from its pid file under Root; 0 if it wrote none.
func (p Private) pid(daemon string) int {
	b, _ := os.ReadFile(filepath.Join(p.Root, daemon+".pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// Signal sends sig to its libvirtd, virtlogd and sshd: SIGSTOP freezes
// them as a host that loses power goes silent, SIGKILL ends them; its
// directories stay for Restart.
func (p Private) Signal(sig syscall.Signal) {
	p.eachDaemon(func(pid int) { _ = syscall.Kill(pid, sig) })
}

// Stop stops its libvirtd, virtlogd and sshd (guests keep running:
// destroy them first) and removes Root.
func (p Private) Stop() {
	p.eachDaemon(host.Stop)
	_ = os.RemoveAll(p.Root)
}

// eachDaemon calls f with the pid of each of its daemons that still runs
// (pids are reused: the program is checked).
func (p Private) eachDaemon(f func(pid int)) {
	for _, d := range []string{"libvirtd", "virtlogd", "sshd"} {
		if pid := p.pid(d); pid > 0 && host.IsProcess(pid, d) {
			f(pid)
		}
	}
}
