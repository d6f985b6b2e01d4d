// Package libvirtd runs libvirtd (under tini, a subreaper for its QEMU
// processes) and virtlogd as child processes, in the caller's network
// namespace (bridges, dnsmasq and tap devices are created there). There is
// one libvirtd per host: its sockets have fixed paths.
package libvirtd

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/lab/controlplane"
	"github.com/labcloud/labcloud/lab/host"
)

// Socket is libvirtd's read-write socket.
const Socket = "/run/libvirt/libvirt-sock"

// Daemon is a running libvirtd with its virtlogd.
type Daemon struct {
	logDir   string
	detached bool
	libvirtd *controlplane.Process // tini, with libvirtd its child
	virtlogd *controlplane.Process
	// libvirtdPid is libvirtd's own pid (from its pid file); 0 until read.
	libvirtdPid int
}

// pidFile is where libvirtd, run as root, writes its pid.
const pidFile = "/run/libvirtd.pid"

// ErrAlreadyRunning means another libvirtd owns the host's sockets.
var ErrAlreadyRunning = errors.New("a libvirtd is already running on this host")

// Prepare makes the host able to run libvirtd without systemd: directories,
// the users and groups the QEMU driver expects, and QEMU running as root
// (lab guests boot from files root owns).
func Prepare() error {
	for _, d := range []string{"/var/log/libvirt/qemu", "/run/libvirt", "/var/lib/libvirt/qemu", "/var/lib/libvirt/dnsmasq"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if _, err := user.LookupGroup("kvm"); err != nil {
		if out, err := exec.Command("groupadd", "-r", "kvm").CombinedOutput(); err != nil {
			return fmt.Errorf("groupadd kvm: %v: %s", err, out)
		}
	}
	if _, err := user.LookupGroup("libvirt-qemu"); err != nil {
		if out, err := exec.Command("groupadd", "-r", "libvirt-qemu").CombinedOutput(); err != nil {
			return fmt.Errorf("groupadd libvirt-qemu: %v: %s", err, out)
		}
	}
	if _, err := user.Lookup("libvirt-qemu"); err != nil {
		if out, err := exec.Command("useradd", "-r", "-g", "libvirt-qemu", "-G", "kvm", "-s", "/usr/sbin/nologin", "-d", "/var/lib/libvirt", "libvirt-qemu").CombinedOutput(); err != nil {
			return fmt.Errorf("useradd libvirt-qemu: %v: %s", err, out)
		}
	}
	return setQEMUUser("/etc/libvirt/qemu.conf")
}

var (
	userLine  = regexp.MustCompile(`(?m)^\s*#?\s*user\s*=.*$`)
	groupLine = regexp.MustCompile(`(?m)^\s*#?\s*group\s*=.*$`)
)

func setQEMUUser(path string) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		data, err = nil, os.MkdirAll(filepath.Dir(path), 0o755) // Debian ships no qemu.conf without libvirt-daemon-system
	}
	if err != nil {
		return fmt.Errorf("libvirt QEMU driver config: %w", err)
	}
	s := string(data)
	if strings.Contains(s, "\nuser = \"root\"") && strings.Contains(s, "\ngroup = \"root\"") {
		return nil
	}
	s = userLine.ReplaceAllString(s, "")
	s = groupLine.ReplaceAllString(s, "")
	s += "\nuser = \"root\"\ngroup = \"root\"\n"
	return os.WriteFile(path, []byte(s), 0o600)
}

// Running reports whether some libvirtd answers on the host socket.
func Running() bool {
	c, err := libvirt.NewConnect("qemu:///system?socket=" + Socket)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Start starts virtlogd and libvirtd in the current network namespace and
// waits until libvirtd answers. Logs go to logDir. They stop with ctx.
func Start(ctx context.Context, logDir string) (*Daemon, error) {
	return start(ctx, logDir, false)
}

// StartDetached is Start for daemons that outlive the caller (the lab).
func StartDetached(ctx context.Context, logDir string) (*Daemon, error) {
	return start(ctx, logDir, true)
}

func start(ctx context.Context, logDir string, detached bool) (*Daemon, error) {
	if Running() {
		return nil, fmt.Errorf("%w (socket %s answers); stop it first", ErrAlreadyRunning, Socket)
	}
	if err := Prepare(); err != nil {
		return nil, err
	}
	d := &Daemon{logDir: logDir, detached: detached}
	return d, d.start(ctx)
}

func (d *Daemon) run(ctx context.Context, name string) (*controlplane.Process, error) {
	log := filepath.Join(d.logDir, name+".log")
	args := []string{name}
	if name == "libvirtd" {
		// libvirt daemonizes QEMU, so a guest's QEMU is an orphan, and
		// libvirt reports the guest stopped only once that process is
		// reaped. Orphans go to the nearest subreaper ancestor: tini -s,
		// which reaps at once, rather than the host's init (which, in a
		// container host, may reap seconds late).
		d.libvirtdPid = 0
		tini := []string{"tini", "-s"}
		if !d.detached {
			// Dies with the caller, as a child process does: tini
			// passes the signal on to libvirtd.
			tini = append(tini, "-p", "SIGTERM")
		}
		args = append(tini, "--", name)
	}
	if !d.detached {
		return controlplane.StartProcess(ctx, log, args[0], args[1:]...)
	}
	return controlplane.StartDaemon(log, args[0], args[1:]...)
}

// readPid records libvirtd's own pid (it runs under tini).
func (d *Daemon) readPid() error {
	b, err := os.ReadFile(pidFile)
	if err == nil {
		d.libvirtdPid, err = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if err != nil {
		return fmt.Errorf("libvirtd's pid from %s: %w", pidFile, err)
	}
	return nil
}

// HoldLock starts a process that holds LockPath for as long as it lives:
// the lab's daemons outlive labcloud up, and so must its claim on libvirtd.
// The caller must not hold the lock itself.
func HoldLock(logDir string) (*controlplane.Process, error) { return holdLock(LockPath, logDir) }

// holdLock: --no-fork makes flock become the sleep, so stopping the one
// recorded process releases the lock; a forked sleep would outlive a
// stopped flock and hold the lock, orphaned, for ever.
func holdLock(path, logDir string) (*controlplane.Process, error) {
	p, err := controlplane.StartDaemon(filepath.Join(logDir, "lock-holder.log"), "flock", "--nonblock", "--no-fork", path, "sleep", "infinity")
	if err != nil {
		return nil, err
	}
	time.Sleep(100 * time.Millisecond)
	if p.Exited() {
		return nil, fmt.Errorf("another lab or e2e run holds %s", path)
	}
	return p, nil
}

// Pids are the daemons' process ids (libvirtd, virtlogd).
func (d *Daemon) Pids() (libvirtd, virtlogd int) { return d.LibvirtdPid(), d.virtlogd.Pid() }

func (d *Daemon) start(ctx context.Context) error {
	for _, bin := range []string{"virtlogd", "libvirtd"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%s not installed (apt-get install libvirt-daemon libvirt-daemon-driver-qemu): %w", bin, err)
		}
	}
	// A libvirtd that was just stopped may still hold its drivers' pid
	// files; a new one started beside it exits at once.
	waitExited("libvirtd", 20*time.Second)
	// Stale sockets and pid files from a daemon that was killed.
	for _, f := range []string{"/run/libvirtd.pid", "/run/virtlogd.pid", Socket, "/run/libvirt/libvirt-sock-ro", "/run/libvirt/libvirt-admin-sock", "/run/libvirt/virtlogd-sock", "/run/libvirt/virtlogd-admin-sock"} {
		_ = os.Remove(f)
	}
	var err error
	if d.virtlogd, err = d.run(ctx, "virtlogd"); err != nil {
		return err
	}
	if d.libvirtd, err = d.run(ctx, "libvirtd"); err != nil {
		d.virtlogd.Stop()
		return err
	}
	if err := d.waitRunning(ctx); err != nil {
		tail := d.libvirtd.Tail(10)
		d.Stop()
		return fmt.Errorf("libvirtd did not start (%w); last log lines:\n%s", err, tail)
	}
	if err := d.readPid(); err != nil {
		d.Stop()
		return err
	}
	return nil
}

// waitExited waits until no process runs program, at most timeout.
func waitExited(program string, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && len(host.Processes(func(args []string) bool {
		return len(args) > 0 && filepath.Base(args[0]) == program
	})) > 0 {
		time.Sleep(100 * time.Millisecond)
	}
}

// waitRunning waits up to 30 s until libvirtd answers on Socket; it fails
// at once when libvirtd exits.
func (d *Daemon) waitRunning(ctx context.Context) error {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		if Running() {
			return true, nil
		}
		if d.libvirtd.Exited() {
			// tini's code: libvirtd's, or 128+signal when a signal ended it.
			return false, fmt.Errorf("libvirtd exited with code %d", d.libvirtd.Wait())
		}
		return false, nil
	})
}

// Detached is the daemons StartDetached started, seen from a later process
// (the lab's daemons outlive labcloud up): StartLibvirtd starts libvirtd
// again, detached and logging to logDir, the way StartDetached did.
func Detached(logDir string) *Daemon { return &Daemon{logDir: logDir, detached: true} }

// LibvirtdPid is libvirtd's process id, 0 when this Daemon has not started it.
func (d *Daemon) LibvirtdPid() int {
	if d.libvirtd == nil {
		return 0
	}
	if d.libvirtdPid != 0 {
		return d.libvirtdPid
	}
	return d.libvirtd.Pid()
}

// StopLibvirtd stops libvirtd only (guests keep running, as when the
// daemon is restarted for an upgrade).
func (d *Daemon) StopLibvirtd() {
	if d.libvirtd != nil {
		d.libvirtd.Stop()
	}
}

// StartLibvirtd starts libvirtd again after StopLibvirtd.
func (d *Daemon) StartLibvirtd(ctx context.Context) error {
	var err error
	_ = os.Remove(Socket)
	if d.libvirtd, err = d.run(ctx, "libvirtd"); err != nil {
		return err
	}
	if err := d.waitRunning(ctx); err != nil {
		return fmt.Errorf("libvirtd did not restart; last log lines:\n%s", d.libvirtd.Tail(10))
	}
	return d.readPid()
}

// Stop stops libvirtd and virtlogd. Guests keep running: destroy them first.
func (d *Daemon) Stop() {
	if d.libvirtd != nil {
		d.libvirtd.Stop()
	}
	if d.virtlogd != nil {
		d.virtlogd.Stop()
	}
}

// LockPath serializes users of the host's one libvirtd: e2e runs hold it
// while they run, a lab holds it (through a holder process) while it is up.
const LockPath = "/run/lock/labcloud-libvirtd.lock"

// Lock waits until no other holder (an e2e run, a lab) uses the host's
// libvirtd, then holds it until release is called or the process exits.
func Lock(ctx context.Context, waiting func()) (release func(), err error) {
	if err := os.MkdirAll(filepath.Dir(LockPath), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(LockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	told := false
	for {
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
			return func() { f.Close() }, nil
		}
		if !told && waiting != nil {
			waiting()
			told = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// Network is a transient routed libvirt network with a bridge: IPv4 with
// DHCP, and optionally IPv6 with router advertisements and DHCPv6. Its
// dnsmasq serves no DNS: port 53 on the gateway is the cluster DNS's.
type Network struct {
	Name, Bridge string
	// IPv4Prefix is the /24's first three octets: the bridge's address is
	// IPv4Prefix.Address (1 when 0), leases IPv4Prefix.DHCPFirst-DHCPLast.
	IPv4Prefix          string
	Address             int
	DHCPFirst, DHCPLast int
	// Hosts4 pins IPv4 addresses to MACs. A network with no range
	// (DHCPFirst 0) leases to these only: where several hosts' networks
	// share one LAN, each serves its own guests.
	Hosts4 []IPv4Host
	// Router is the default gateway DHCP hands out; empty for the bridge.
	Router string
	// DNS is the DNS server DHCP hands out (the cluster DNS); empty: none
	// (dnsmasq, serving no DNS itself, names none).
	DNS  string
	IPv6 *IPv6Net
}

// IPv4Host pins an IPv4 address to a MAC.
type IPv4Host struct {
	MAC, IP string
}

// IPv6Net is a network's IPv6 subnet: the bridge's address and prefix
// length, the DHCPv6 range, and addresses pinned to DHCPv6 client IDs.
// libvirt's dnsmasq advertises the prefix with the M flag (addresses by
// DHCPv6, not SLAAC) and the bridge's link-local address as the router.
type IPv6Net struct {
	Address string
	Prefix  int
	// DHCPFirst and DHCPLast are the DHCPv6 range; empty: none, and only
	// Hosts are leased to.
	DHCPFirst, DHCPLast string
	Hosts               []IPv6Host
	// NotDefaultRouter advertises the prefix with a router lifetime of 0:
	// another router on the LAN is the guests' default IPv6 gateway.
	NotDefaultRouter bool
}

// IPv6Host pins an address to a DHCPv6 client's DUID (hex bytes with colons).
type IPv6Host struct {
	DUID, IP string
}

// XML is the network's libvirt definition.
func (n Network) XML() (string, error) {
	type dhcpRange struct {
		Start string `xml:"start,attr"`
		End   string `xml:"end,attr"`
	}
	type host struct {
		ID  string `xml:"id,attr,omitempty"`
		MAC string `xml:"mac,attr,omitempty"`
		IP  string `xml:"ip,attr"`
	}
	type dhcp struct {
		Range *dhcpRange `xml:"range"`
		Hosts []host     `xml:"host"`
	}
	type option struct {
		Value string `xml:"value,attr"`
	}
	type dnsmasqOptions struct {
		Options []option `xml:"dnsmasq:option"`
	}
	type ip struct {
		Family  string `xml:"family,attr,omitempty"`
		Address string `xml:"address,attr"`
		Netmask string `xml:"netmask,attr,omitempty"`
		Prefix  int    `xml:"prefix,attr,omitempty"`
		DHCP    dhcp   `xml:"dhcp"`
	}
	type network struct {
		XMLName xml.Name `xml:"network"`
		Name    string   `xml:"name"`
		Bridge  struct {
			Name  string `xml:"name,attr"`
			STP   string `xml:"stp,attr"`
			Delay string `xml:"delay,attr"`
		} `xml:"bridge"`
		Forward struct {
			Mode string `xml:"mode,attr"`
		} `xml:"forward"`
		DNS struct {
			Enable string `xml:"enable,attr"`
		} `xml:"dns"`
		IPs []ip `xml:"ip"`
		// libvirt's way to pass dnsmasq an option it has no element for.
		DnsmasqNS string          `xml:"xmlns:dnsmasq,attr,omitempty"`
		Dnsmasq   *dnsmasqOptions `xml:"dnsmasq:options"`
	}
	if n.Name == "" || n.Bridge == "" || n.IPv4Prefix == "" {
		return "", fmt.Errorf("network %q: name, bridge and IPv4 prefix are required", n.Name)
	}
	out := network{Name: n.Name}
	out.Bridge.Name, out.Bridge.STP, out.Bridge.Delay = n.Bridge, "off", "0"
	out.Forward.Mode = "route"
	out.DNS.Enable = "no"
	p, addr := n.IPv4Prefix, max(n.Address, 1)
	v4 := ip{Address: fmt.Sprintf("%s.%d", p, addr), Netmask: "255.255.255.0"}
	if n.DHCPFirst > 0 {
		v4.DHCP.Range = &dhcpRange{fmt.Sprintf("%s.%d", p, n.DHCPFirst), fmt.Sprintf("%s.%d", p, n.DHCPLast)}
	}
	for _, h := range n.Hosts4 {
		v4.DHCP.Hosts = append(v4.DHCP.Hosts, host{MAC: h.MAC, IP: h.IP})
	}
	out.IPs = append(out.IPs, v4)
	var opts []option
	if n.DHCPFirst > 0 {
		// dnsmasq pings an address before it first leases it from the
		// range and answers nothing meanwhile: a booting guest's first
		// lease took 3-8 s. The range is the lab's guests' alone.
		opts = append(opts, option{Value: "no-ping"})
	}
	if n.Router != "" {
		opts = append(opts, option{Value: "dhcp-option=option:router," + n.Router})
	}
	if n.DNS != "" {
		opts = append(opts, option{Value: "dhcp-option=option:dns-server," + n.DNS})
	}
	if v6 := n.IPv6; v6 != nil {
		a, err := netip.ParseAddr(v6.Address)
		if err != nil || !a.Is6() || v6.Prefix < 1 || v6.Prefix > 128 {
			return "", fmt.Errorf("network %q: IPv6 address %q/%d: want an IPv6 address and a prefix length 1-128", n.Name, v6.Address, v6.Prefix)
		}
		x := ip{Family: "ipv6", Address: v6.Address, Prefix: v6.Prefix}
		if v6.DHCPFirst != "" {
			x.DHCP.Range = &dhcpRange{v6.DHCPFirst, v6.DHCPLast}
		}
		for _, h := range v6.Hosts {
			x.DHCP.Hosts = append(x.DHCP.Hosts, host{ID: h.DUID, IP: h.IP})
		}
		out.IPs = append(out.IPs, x)
		if v6.NotDefaultRouter {
			opts = append(opts, option{Value: fmt.Sprintf("ra-param=%s,10,0", n.Bridge)})
		}
	}
	if len(opts) > 0 {
		out.DnsmasqNS = "http://libvirt.org/schemas/network/dnsmasq/1.0"
		out.Dnsmasq = &dnsmasqOptions{opts}
	}
	b, err := xml.MarshalIndent(out, "", "  ")
	return string(b), err
}

// Create starts the network.
func (n Network) Create(c *libvirt.Connect) error {
	x, err := n.XML()
	if err != nil {
		return err
	}
	net, err := c.NetworkCreateXML(x)
	if err != nil {
		return fmt.Errorf("create network %s: %w", n.Name, err)
	}
	return net.Free()
}
