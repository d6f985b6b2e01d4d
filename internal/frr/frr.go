// Package frr runs FRR (zebra, bfdd, bgpd from Debian's frr package) as a
// BGP router inside a named network namespace, with its sockets, logs and
// configuration in a directory of its own, and asks it questions through
// vtysh. Tests and the lab use it as the LAN router the CCM peers with.
package frr

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Daemons is where Debian installs FRR's daemons.
const Daemons = "/usr/lib/frr"

// Available says why FRR cannot run here, or nil.
func Available() error {
	for _, d := range []string{"zebra", "bfdd", "bgpd"} {
		if _, err := os.Stat(filepath.Join(Daemons, d)); err != nil {
			return fmt.Errorf("FRR's %s is missing (apt-get install frr): %w", d, err)
		}
	}
	if _, err := exec.LookPath("vtysh"); err != nil {
		return fmt.Errorf("vtysh is missing (apt-get install frr): %w", err)
	}
	if _, err := user.Lookup("frr"); err != nil {
		return fmt.Errorf("no frr user (apt-get install frr): %w", err)
	}
	return nil
}

// Neighbor is one BGP peer of the router.
type Neighbor struct {
	Address netip.Addr
	ASN     uint32
	// BFD runs BFD with the peer at 300 ms × 3.
	BFD bool
	// Password for TCP MD5 signatures.
	Password string
	// NextHopsAnywhere accepts routes whose next hop is not on a network
	// connected to the router (resolved through its other routes), from a
	// directly connected external peer.
	NextHopsAnywhere bool
}

// Config is the router's BGP configuration.
type Config struct {
	ASN       uint32
	RouterID  netip.Addr
	Neighbors []Neighbor
	// AdvertiseOn are interfaces on which zebra sends IPv6 router
	// advertisements (managed flag: addresses by DHCPv6), making the
	// router the LAN's default IPv6 gateway.
	AdvertiseOn []string
}

// Files are the router's configuration, one file per daemon: each
// daemon reads only its own commands, and another daemon's block would
// end its configuration early.
func (c Config) Files() map[string]string {
	var b strings.Builder
	fmt.Fprintf(&b, "router bgp %d\n bgp router-id %s\n no bgp ebgp-requires-policy\n no bgp default ipv4-unicast\n", c.ASN, c.RouterID)
	for _, n := range c.Neighbors {
		fmt.Fprintf(&b, " neighbor %s remote-as %d\n neighbor %s timers connect 1\n", n.Address, n.ASN, n.Address)
		if n.BFD {
			fmt.Fprintf(&b, " neighbor %s bfd profile labcloud\n", n.Address)
		}
		if n.Password != "" {
			fmt.Fprintf(&b, " neighbor %s password %s\n", n.Address, n.Password)
		}
		if n.NextHopsAnywhere {
			fmt.Fprintf(&b, " neighbor %s disable-connected-check\n", n.Address)
		}
	}
	for _, fam := range []string{"ipv4", "ipv6"} {
		fmt.Fprintf(&b, " address-family %s unicast\n", fam)
		for _, n := range c.Neighbors {
			fmt.Fprintf(&b, "  neighbor %s activate\n", n.Address)
		}
		b.WriteString(" exit-address-family\n")
	}
	b.WriteString("exit\n")
	zebra := "hostname labcloud-router\n"
	for _, ifname := range c.AdvertiseOn {
		zebra += fmt.Sprintf("interface %s\n no ipv6 nd suppress-ra\n ipv6 nd ra-interval 3\n ipv6 nd managed-config-flag\nexit\n", ifname)
	}
	return map[string]string{
		"zebra": zebra,
		"bfdd":  "bfd\n profile labcloud\n  receive-interval 300\n  transmit-interval 300\n  detect-multiplier 3\n exit\nexit\n",
		"bgpd":  "frr defaults traditional\n" + b.String(),
	}
}

// Router is FRR running in one network namespace; its daemons outlive
// the process that started them until Stop.
type Router struct {
	dir string
}

// Open is the router whose files are in dir, started earlier.
func Open(dir string) *Router { return &Router{dir: dir} }

var daemons = []string{"zebra", "bfdd", "bgpd"}

// Start runs zebra, bfdd and bgpd as daemons in the named network
// namespace (/run/netns/NAME), with everything they write in dir.
func Start(ctx context.Context, netns, dir string, cfg Config) (*Router, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	u, err := user.Lookup("frr")
	if err != nil {
		return nil, err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, err
	}
	if err := reachable(dir, uid); err != nil {
		return nil, err
	}
	for daemon, text := range cfg.Files() {
		conf := filepath.Join(dir, daemon+".conf")
		if err := os.WriteFile(conf, []byte(text), 0o640); err != nil {
			return nil, err
		}
		if err := os.Chown(conf, uid, gid); err != nil {
			return nil, err
		}
	}
	r := &Router{dir: dir}
	zserv := filepath.Join(dir, "zserv.api")
	for _, d := range daemons {
		args := []string{"netns", "exec", netns, filepath.Join(Daemons, d), "-d",
			"-u", "frr", "-g", "frr", "-f", filepath.Join(dir, d+".conf"), "--vty_socket", dir, "-z", zserv,
			"-i", r.pidFile(d), "--log", "file:" + filepath.Join(dir, d+".log"), "-A", "127.0.0.1"}
		if d == "bfdd" {
			args = append(args, "--bfdctl", filepath.Join(dir, "bfdd.sock"))
		}
		if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
			r.Stop()
			return nil, fmt.Errorf("start %s: %w: %s", d, err, bytes.TrimSpace(out))
		}
		// bfdd and bgpd connect to zebra's socket, and vtysh to each vty.
		wait := filepath.Join(dir, d+".vty")
		if d == "zebra" {
			wait = zserv
		}
		if err := waitFor(ctx, wait); err != nil {
			r.Stop()
			return nil, fmt.Errorf("%s did not start (%s): %w", d, filepath.Join(dir, d+".log"), err)
		}
	}
	return r, nil
}

// reachable says which parent of dir keeps the daemons (user uid, once
// they drop root) out of it.
func reachable(dir string, uid int) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for p := filepath.Dir(abs); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm()&0o001 == 0 && !(ok && int(st.Uid) == uid) {
			return fmt.Errorf("FRR's daemons (user frr) cannot reach %s: %s is mode %04o", dir, p, fi.Mode().Perm())
		}
		if p == "/" {
			return nil
		}
	}
}

func (r *Router) pidFile(daemon string) string { return filepath.Join(r.dir, daemon+".pid") }

func waitFor(ctx context.Context, path string) error {
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		_, err := os.Stat(path)
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("no %s: %w", path, err)
	}
	return nil
}

// Stop ends every daemon (SIGTERM, then SIGKILL after 5 s) and waits
// until they are gone.
func (r *Router) Stop() {
	var pids []int
	for _, d := range daemons {
		data, err := os.ReadFile(r.pidFile(d))
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && pid > 1 {
			pids = append(pids, pid)
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
	}
	// A daemon's parent is whoever reaps orphans here; an unreaped one
	// still answers signal 0, hence the bound.
	killAt := time.Now().Add(5 * time.Second)
	giveUp := killAt.Add(5 * time.Second)
	for _, pid := range pids {
		for syscall.Kill(pid, 0) == nil && time.Now().Before(giveUp) {
			if time.Now().After(killAt) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, d := range daemons {
		_ = os.Remove(r.pidFile(d))
	}
}

// Vtysh runs one vtysh command (e.g. "show ip route bgp json") and returns
// its output.
func (r *Router) Vtysh(ctx context.Context, command string) (string, error) {
	return Vtysh(ctx, r.dir, command)
}

// Vtysh runs one vtysh command against the router whose sockets are in dir.
func Vtysh(ctx context.Context, dir, command string) (string, error) {
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, "vtysh", "--vty_socket", dir, "-c", command)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("vtysh -c %q: %w: %s", command, err, strings.TrimSpace(errOut.String()))
	}
	return out.String(), nil
}

// Route is one route of zebra's RIB that BGP put there.
type Route struct {
	Prefix   netip.Prefix
	NextHops []netip.Addr
	// Selected: zebra chose it for forwarding.
	Selected bool
}

// BGPRoutes lists zebra's BGP routes of one family ("ip" or "ipv6").
func (r *Router) BGPRoutes(ctx context.Context, family string) (map[netip.Prefix]Route, error) {
	out, err := r.Vtysh(ctx, "show "+family+" route bgp json")
	if err != nil {
		return nil, err
	}
	var rib map[string][]struct {
		Prefix   string `json:"prefix"`
		Selected bool   `json:"selected"`
		Nexthops []struct {
			IP string `json:"ip"`
		} `json:"nexthops"`
	}
	if err := json.Unmarshal([]byte(out), &rib); err != nil {
		return nil, fmt.Errorf("show %s route bgp json: %w", family, err)
	}
	routes := map[netip.Prefix]Route{}
	for _, entries := range rib {
		for _, e := range entries {
			p, err := netip.ParsePrefix(e.Prefix)
			if err != nil {
				return nil, fmt.Errorf("show %s route bgp json: prefix %q: %w", family, e.Prefix, err)
			}
			rt := Route{Prefix: p, Selected: e.Selected}
			for _, h := range e.Nexthops {
				if a, err := netip.ParseAddr(h.IP); err == nil {
					rt.NextHops = append(rt.NextHops, a)
				}
			}
			routes[p] = rt
		}
	}
	return routes, nil
}

// WaitBGPRoutes polls the router's BGP routes of one family until ok
// holds, and returns them; on timeout, the last ones read with the error.
func (r *Router) WaitBGPRoutes(ctx context.Context, family string, timeout time.Duration, ok func(map[netip.Prefix]Route) bool) (map[netip.Prefix]Route, error) {
	var last map[netip.Prefix]Route
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		rib, err := r.BGPRoutes(ctx, family)
		if err != nil {
			return false, err
		}
		last = rib
		return ok(rib), nil
	})
	return last, err
}

// ErrNoSession is returned by NeighborState for a peer the router does not know.
var ErrNoSession = errors.New("no such BGP neighbor")

// NeighborState is the router's BGP state for one neighbour (e.g.
// "Established", "Active").
func (r *Router) NeighborState(ctx context.Context, addr netip.Addr) (string, error) {
	out, err := r.Vtysh(ctx, "show bgp neighbors "+addr.String()+" json")
	if err != nil {
		return "", err
	}
	var n map[string]struct {
		State string `json:"bgpState"`
	}
	if err := json.Unmarshal([]byte(out), &n); err != nil {
		return "", fmt.Errorf("show bgp neighbors json: %w", err)
	}
	s, ok := n[addr.String()]
	if !ok {
		return "", fmt.Errorf("%s: %w", addr, ErrNoSession)
	}
	return s.State, nil
}

// LogTail is the end of each daemon's log, for a failing test to show.
func (r *Router) LogTail(lines int) string {
	var b strings.Builder
	for _, d := range daemons {
		data, _ := os.ReadFile(filepath.Join(r.dir, d+".log"))
		all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		fmt.Fprintf(&b, "--- %s.log\n%s\n", d, strings.Join(all[max(0, len(all)-lines):], "\n"))
	}
	return b.String()
}
