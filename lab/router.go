package lab

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/labcloud/labcloud/internal/frr"
	"github.com/labcloud/labcloud/provider"
)

// The lab's LAN router: FRR in a namespace of its own, whose bridge is the
// LAN every host's bridge is plugged into, as the hypervisors of a homelab
// share a switch with its router. Each host's CCM replica peers with it
// over BGP and announces the pod CIDRs of its host's Nodes; the router
// installs them in its kernel, so it reaches every pod through its node.
const (
	RouterNetns = "labcloud-router"
	RouterAddr6 = "fd00:10:123::fe"
	routerASN   = 64512
	ccmASN      = 64513
	HostUplink  = "lcrt0" // a host's port to the LAN, in its namespace
	lanBridge   = "lan0"  // the LAN, in the router's namespace
)

// routerDir holds the router's sockets, configuration and logs: under
// /run, which FRR's daemons can reach once they run as user frr (a state
// directory is private to root), one per state directory.
func routerDir(stateDir string) string { return runDir(stateDir, "router") }

// runDir is the lab's directory called name under /run/labcloud, one per
// state directory: short (a socket's path must be) and reachable by
// daemons that drop root.
func runDir(stateDir, name string) string {
	abs, _ := filepath.Abs(stateDir)
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join(routerRunDir, name+"-"+hex.EncodeToString(sum[:4]))
}

const routerRunDir = "/run/labcloud"

// startRouter runs the router and plugs every host into its LAN, or says
// why it cannot and leaves it out (a lab of one host then has no BGP; one
// of several cannot do without it).
func (u *upRun) startRouter(ctx context.Context) error {
	if err := frr.Available(); err != nil {
		if len(u.st.Hosts) > 1 {
			return fmt.Errorf("a lab of several hosts needs the LAN router: %w", err)
		}
		fmt.Fprintf(u.opts.Out, "           no LAN router: %v\n", err)
		return nil
	}
	addrs := []string{u.st.routerAddress() + "/24"}
	if u.st.IPFamily.HasIPv6() {
		addrs = append(addrs, RouterAddr6+"/64")
	}
	cmds := [][]string{ // in RouterNetns, which MakeNamespaces made
		{"-n", RouterNetns, "link", "add", lanBridge, "type", "bridge", "stp_state", "0", "forward_delay", "0"},
	}
	for _, a := range addrs {
		cmds = append(cmds, []string{"-n", RouterNetns, "addr", "add", a, "dev", lanBridge, "nodad"})
	}
	cmds = append(cmds, []string{"-n", RouterNetns, "link", "set", lanBridge, "up"})
	var inHosts [][]string // command lines, each run in its host's namespace
	for _, h := range u.st.Hosts {
		port := fmt.Sprintf("host%d", h.Index)
		cmds = append(cmds,
			[]string{"-n", h.Netns, "link", "add", HostUplink, "type", "veth", "peer", "name", port, "netns", RouterNetns},
			[]string{"-n", RouterNetns, "link", "set", port, "master", lanBridge, "up"})
		if !u.st.Routed {
			cmds = append(cmds, []string{"-n", h.Netns, "link", "set", HostUplink, "master", Bridge, "up"})
			continue
		}
		for _, c := range u.st.Addressing.lan().HostCommands(h.Index, HostUplink, Bridge, u.st.Addressing.ClusterCIDR()) {
			inHosts = append(inHosts, append([]string{"netns", "exec", h.Netns}, c...))
		}
	}
	if u.st.Routed {
		for _, r := range u.st.Addressing.lan().RouterRoutes(len(u.st.Hosts)) {
			inHosts = append(inHosts, append([]string{"-n", RouterNetns}, r...))
		}
	}
	for _, args := range append(cmds, inHosts...) {
		if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	// Beyond the LAN is the first host's uplink to the real host (lab/uplink):
	// guests whose gateway is the router reach out, and answer the host, that way.
	defaults := [][]string{{"-n", RouterNetns, "route", "replace", "default", "via", u.st.Hosts[0].lanAddress()}}
	if u.st.IPFamily.HasIPv6() {
		defaults = append(defaults, []string{"-n", RouterNetns, "-6", "route", "replace", "default", "via", u.st.Hosts[0].Address6})
	}
	for _, args := range defaults {
		if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	for _, sysctl := range []string{"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"} {
		if out, err := exec.CommandContext(ctx, "ip", "netns", "exec", RouterNetns, "sysctl", "-qw", sysctl).CombinedOutput(); err != nil {
			return fmt.Errorf("sysctl %s in %s: %w: %s", sysctl, RouterNetns, err, out)
		}
	}
	if err := os.MkdirAll(routerRunDir, 0o755); err != nil {
		return err
	}
	cfg := routerConfig(u.st.Hosts, u.st.Routed, u.st.Addressing)
	if len(u.st.Hosts) > 1 && u.st.IPFamily.HasIPv6() {
		cfg.AdvertiseOn = []string{lanBridge} // the hosts' advertisements say they are no router
	}
	if _, err := frr.Start(ctx, RouterNetns, routerDir(u.st.Dir), cfg); err != nil {
		return err
	}
	u.st.Router = true
	fmt.Fprintf(u.opts.Out, "           FRR at %s (AS %d) in namespace %s; the CCM peers as AS %d\n", u.st.routerAddress(), routerASN, RouterNetns, ccmASN)
	return nil
}

// routerConfig is the router's side: each host's CCM replica (on its
// address on the LAN) a neighbour, with BFD. In a routed lab the nodes the
// replicas name as next hops are on the hosts' subnets, reached through
// the static routes to them.
func routerConfig(hosts []Host, routed bool, a Addressing) frr.Config {
	cfg := frr.Config{ASN: routerASN, RouterID: netip.MustParseAddr(a.RouterAddr())}
	for _, h := range hosts {
		cfg.Neighbors = append(cfg.Neighbors, frr.Neighbor{Address: netip.MustParseAddr(h.lanAddress()), ASN: ccmASN, BFD: true, NextHopsAnywhere: routed})
	}
	return cfg
}

// routerAddress is the router's address on the LAN.
func (s *State) routerAddress() string {
	if s.Routed {
		return s.Addressing.lan().RouterAddr()
	}
	return s.Addressing.RouterAddr()
}

// waitBGPSessions waits, in a lab of several hosts, until every host's
// replica has an established BGP session with the router: a replica that
// cannot reach it would leave its host's pods unreachable from the others.
func (u *upRun) waitBGPSessions(ctx context.Context) error {
	if !u.st.Router || len(u.st.Hosts) < 2 {
		return nil
	}
	r := frr.Open(routerDir(u.st.Dir))
	var missing []string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, bgpSessionBound, true, func(ctx context.Context) (bool, error) {
		missing = nil
		for _, h := range u.st.Hosts {
			if s, err := r.NeighborState(ctx, netip.MustParseAddr(h.lanAddress())); err != nil || s != "Established" {
				missing = append(missing, fmt.Sprintf("%s (%s): %s", h.Name, h.lanAddress(), sessionState(s, err)))
			}
		}
		return len(missing) == 0, nil
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("the router has no established BGP session after %s with: %s (labcloud logs ccm, labcloud router -- show bgp summary)", bgpSessionBound, strings.Join(missing, "; "))
	}
	return err
}

// bgpSessionBound is how long replicas have to reach the router: BGP's
// connect retry is seconds.
const bgpSessionBound = 60 * time.Second

func sessionState(s string, err error) string {
	if err != nil {
		return err.Error()
	}
	return s
}

// labBGP is the CCM's side, in the cloud config of host h's replica: in
// a routed lab it also announces the VIPs of its host's nodes.
func labBGP(h Host, a Addressing) provider.BGPConfig {
	cfg := provider.DefaultConfig().BGP
	cfg.ASN = ccmASN
	cfg.RouterID = h.lanAddress()
	router := a.RouterAddr()
	if h.Uplink != "" {
		router, cfg.AnnounceVIPs = a.lan().RouterAddr(), true
	}
	cfg.Peers = []provider.BGPPeerConfig{{Address: router, ASN: routerASN, BFD: true}}
	return cfg
}

// stopRouter stops the router's daemons and removes its namespace.
func stopRouter(stateDir string) {
	frr.Open(routerDir(stateDir)).Stop()
	_ = os.RemoveAll(routerDir(stateDir))
	_ = exec.Command("ip", "netns", "del", RouterNetns).Run()
}

// ErrNoRouter: the lab runs without a router.
var ErrNoRouter = errors.New("this lab has no LAN router (FRR was not installed when it came up)")

// RouterCommand runs one vtysh command on the lab's router and returns
// its output.
func RouterCommand(ctx context.Context, st *State, command string) (string, error) {
	if !st.Router {
		return "", ErrNoRouter
	}
	if _, err := os.Stat(routerDir(st.Dir)); err != nil {
		return "", fmt.Errorf("the lab's router: %w", err)
	}
	return frr.Vtysh(ctx, routerDir(st.Dir), command)
}
