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

	"github.com/labcloud/labcloud/internal/frr"
	"github.com/labcloud/labcloud/provider"
)

// The lab's LAN router: FRR in a namespace of its own, plugged into the
// lab's bridge as another machine on the LAN would be. The CCM peers with
// it over BGP and announces every Node's pod CIDR; the router installs
// them in its kernel, so it reaches every pod through its node.
const (
	RouterNetns  = "labcloud-router"
	RouterAddr   = "10.123.0.254"
	RouterAddr6  = "fd00:10:123::fe"
	routerASN    = 64512
	ccmASN       = 64513
	routerLink   = "lcrt0" // its end on the bridge, in the lab's namespace
	routerIfname = "lan0"  // its end in the router's namespace
)

// routerDir holds the router's sockets, configuration and logs: under
// /run, which FRR's daemons can reach once they run as user frr (a state
// directory is private to root), one per state directory.
func routerDir(stateDir string) string {
	abs, _ := filepath.Abs(stateDir)
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join(routerRunDir, "router-"+hex.EncodeToString(sum[:4]))
}

const routerRunDir = "/run/labcloud"

// startRouter runs the router, or says why it cannot and leaves it out
// (the lab then has no BGP).
func (u *upRun) startRouter(ctx context.Context) error {
	if err := frr.Available(); err != nil {
		fmt.Fprintf(u.opts.Out, "           no LAN router: %v\n", err)
		return nil
	}
	_ = exec.Command("ip", "netns", "del", RouterNetns).Run()
	addrs := []string{RouterAddr + "/24"}
	if u.st.IPFamily.HasIPv6() {
		addrs = append(addrs, RouterAddr6+"/64")
	}
	cmds := [][]string{
		{"netns", "add", RouterNetns},
		{"-n", RouterNetns, "link", "set", "lo", "up"},
		{"-n", Netns, "link", "add", routerLink, "type", "veth", "peer", "name", routerIfname, "netns", RouterNetns},
		{"-n", Netns, "link", "set", routerLink, "master", Bridge, "up"},
	}
	for _, a := range addrs {
		cmds = append(cmds, []string{"-n", RouterNetns, "addr", "add", a, "dev", routerIfname, "nodad"})
	}
	cmds = append(cmds, []string{"-n", RouterNetns, "link", "set", routerIfname, "up"})
	for _, args := range cmds {
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
	if _, err := frr.Start(ctx, RouterNetns, routerDir(u.st.Dir), routerConfig()); err != nil {
		return err
	}
	u.st.Router = true
	fmt.Fprintf(u.opts.Out, "           FRR at %s (AS %d) in namespace %s; the CCM peers as AS %d\n", RouterAddr, routerASN, RouterNetns, ccmASN)
	return nil
}

// routerConfig is the router's side: the CCM (on the bridge's address)
// as its one neighbour, with BFD.
func routerConfig() frr.Config {
	return frr.Config{ASN: routerASN, RouterID: netip.MustParseAddr(RouterAddr),
		Neighbors: []frr.Neighbor{{Address: netip.MustParseAddr(Gateway), ASN: ccmASN, BFD: true}}}
}

// labBGP is the CCM's side, in the lab's cloud config.
func labBGP() provider.BGPConfig {
	cfg := provider.DefaultConfig().BGP
	cfg.ASN = ccmASN
	cfg.RouterID = Gateway
	cfg.Peers = []provider.BGPPeerConfig{{Address: RouterAddr, ASN: routerASN, BFD: true}}
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
