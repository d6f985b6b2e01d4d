package lab

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/lab/host"
	"github.com/labcloud/labcloud/lab/libvirtd"
)

// MaxHosts is the most hypervisor hosts up --hosts makes.
const MaxHosts = 8

// Host is one of the lab's hypervisor hosts. Host 1 is the lab's own
// namespace, with the control plane and the machine's libvirtd; each other
// host is a namespace of its own with a libvirtd of its own
// (libvirtd.Private), a bridge of the same name and a CCM replica. With
// several hosts their bridges are ports of one LAN, a bridge in the
// router's namespace, as a homelab's hypervisors are on one switch.
type Host struct {
	Index int    `json:"index"`
	Name  string `json:"name"` // also its hypervisor's zone
	Netns string `json:"netns"`
	// Address and Address6 are its bridge's addresses on the lab's
	// subnets (the IPv6 one used when the lab's family has IPv6).
	Address  string `json:"address"`
	Address6 string `json:"address6,omitempty"`
	// Uplink is its address on the LAN in a routed lab (up --routed),
	// where its bridge is a subnet of its own; empty: the bridge is on
	// the LAN.
	Uplink string `json:"uplink,omitempty"`
	URI    string `json:"uri"` // its libvirtd, from any namespace
	// SSHURI is how the first host's CCM reaches a host other than the
	// first: over ssh, as one hypervisor host reaches another
	// (docs/several-hosts.md). grantSSH sets it.
	SSHURI string `json:"sshURI,omitempty"`
	// Pids are the daemons of a host other than the first (its libvirtd
	// under tini, the CCM replica); the first's are in State.Pids.
	Pids map[string]int `json:"pids,omitempty"`
	// CCMCommand is its CCM replica's command line, for a host other than
	// the first (the first's is State.CCMCommand).
	CCMCommand []string `json:"ccmCommand,omitempty"`
	// Lost is set between LoseHost and RestoreHost: its daemons are frozen
	// and its libvirtd would never answer.
	Lost bool `json:"lost,omitempty"`
}

// labHosts are the hosts of a lab of n on a's network: with one, the
// lab's namespace as it always was, zone lab-host; with several,
// lab-host1..n.
func labHosts(stateDir string, n int, a Addressing) []Host {
	if n <= 1 {
		return []Host{{Index: 1, Name: labHost, Netns: Netns, Address: a.Gateway(), Address6: Gateway6, URI: labURI}}
	}
	out := make([]Host, n)
	for k := 1; k <= n; k++ {
		h := Host{Index: k, Name: fmt.Sprintf("%s%d", labHost, k), Netns: Netns, Address: a.Gateway(), Address6: Gateway6, URI: labURI}
		if k > 1 {
			h.Netns = fmt.Sprintf("%s-host%d", Netns, k)
			h.Address = a.Addr(k).String()
			h.Address6 = fmt.Sprintf("%s%x", strings.TrimSuffix(Gateway6, "1"), k)
			h.URI = h.private(stateDir).URI()
		}
		out[k-1] = h
	}
	return out
}

// routeHosts gives the hosts of a routed lab their addresses: host K's
// bridge on a subnet of its own (lan.Plan.Subnet), an uplink on the LAN.
func routeHosts(hosts []Host, a Addressing) {
	for i := range hosts {
		h := &hosts[i]
		h.Uplink = a.lan().Uplink(h.Index)
		h.Address = a.lan().Subnet(h.Index) + ".1"
	}
}

// lanAddress is where the router reaches h: its uplink in a routed lab,
// else its bridge on the LAN.
func (h Host) lanAddress() string { return cmp.Or(h.Uplink, h.Address) }

// private is the libvirtd of a host other than the first, with its sshd:
// its directories under /run (short, for the socket's path), one set per
// state directory.
func (h Host) private(stateDir string) libvirtd.Private {
	return libvirtd.Private{Root: runDir(stateDir, fmt.Sprintf("host%d", h.Index)), Netns: h.Netns, SSH: true}
}

// ccmURI is how host self's CCM reaches h: the first host's reaches every
// other over ssh (once grantSSH ran); a replica reaches every host through
// its libvirtd's socket.
func (h Host) ccmURI(self Host) string {
	if self.Index == 1 && h.SSHURI != "" {
		return h.SSHURI
	}
	return h.URI
}

// sshDir holds the first host's key and known_hosts for the others, as
// /etc/libvirt-cloud-controller-manager does on a real host.
func sshDir(stateDir string) string { return filepath.Join(stateDir, "ssh") }

// grantSSH gives the first host's CCM ssh access to every other host, as
// docs/several-hosts.md tells an administrator to: a key their sshd
// accepts and their host keys in known_hosts, scanned over the LAN from
// the lab's namespace, where that CCM runs (so it runs once the LAN is
// up). It sets each one's SSHURI.
func (u *upRun) grantSSH() error {
	if len(u.st.Hosts) < 2 {
		return nil
	}
	dir := sshDir(u.st.Dir)
	_ = os.RemoveAll(dir) // a previous lab's hosts had other keys
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	for i := 1; i < len(u.st.Hosts); i++ {
		h := &u.st.Hosts[i]
		key, known, err := h.private(u.st.Dir).GrantSSH(dir, h.lanAddress(), "")
		if err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
		h.SSHURI = libvirtd.SSHURI(h.lanAddress(), key, known)
	}
	return u.st.Save()
}

// LabHosts are the lab's hosts; a state written before labs had several
// has one.
func (s *State) LabHosts() []Host {
	if len(s.Hosts) > 0 {
		return s.Hosts
	}
	h := labHosts(s.Dir, 1, s.Addressing)
	h[0].URI = s.LibvirtURI()
	return h
}

// hostOfGuest is the host guest i (1-based) runs on: round robin.
func hostOfGuest(i, hosts int) int { return (i-1)%hosts + 1 }

// guestIPv4 is guest i's pinned IPv4 address on its host's subnet (of the
// prefix given): each host's network leases to its own guests only.
func guestIPv4(prefix string, i int) string { return fmt.Sprintf("%s.%d", prefix, dhcpFirst-1+i) }

// hostNetwork is host h's libvirt network in a lab of several hosts of
// Addresses a: the lab's network with h's bridge addresses, leasing only to
// h's guests, with the LAN router as their gateway of each family (it
// learns every pod CIDR over BGP; for IPv6 it advertises itself, and h's
// advertisements carry the prefix only). In a routed lab it is h's own
// subnet, and h is its guests' gateway.
func hostNetwork(h Host, hosts int, a Addresses) libvirtd.Network {
	n := libvirtd.Network{Name: NetworkName, Bridge: Bridge, IPv4Prefix: a.octets(), Address: h.Index, Router: a.RouterAddr(), DNS: a.Gateway()}
	if h.Uplink != "" {
		n.IPv4Prefix, n.Address, n.Router = a.lan().Subnet(h.Index), 1, ""
	}
	if a.family.HasIPv6() {
		n.IPv6 = &libvirtd.IPv6Net{Address: h.Address6, Prefix: 64, NotDefaultRouter: true}
	}
	for i := 1; i <= MaxNodes; i++ {
		if hostOfGuest(i, hosts) != h.Index {
			continue
		}
		n.Hosts4 = append(n.Hosts4, libvirtd.IPv4Host{MAC: nodeMAC(i), IP: guestIPv4(n.IPv4Prefix, i)})
		if n.IPv6 != nil {
			n.IPv6.Hosts = append(n.IPv6.Hosts, libvirtd.IPv6Host{DUID: nodeDUID(i), IP: nodeIPv6(i)})
		}
	}
	return n
}

// CreateNetwork creates host h's libvirt network, as up does.
func (s *State) CreateNetwork(h Host) error {
	c, err := libvirt.NewConnect(h.URI)
	if err != nil {
		return err
	}
	defer c.Close()
	n := s.addressing().network()
	if hosts := s.LabHosts(); len(hosts) > 1 {
		n = hostNetwork(h, len(hosts), s.addressing())
	}
	if err := n.Create(c); err != nil {
		return err
	}
	if h.Netns != s.Netns || s.Light { // the uplink ends in the lab's own namespace
		return nil
	}
	return openLabForwarding()
}

// MakeNamespaces makes, afresh, the network namespaces a lab of opts
// runs in: the lab's, the router's (full lab) and each other host's, each
// with its loopback up, and for a full lab the uplink from the host's
// namespace to the lab's (it refuses first a lab whose addresses overlap
// the host's routes). It must run in the host's mount and network
// namespaces, where their names must be seen; the caller holds the host
// lock.
func MakeNamespaces(opts Options) error {
	names := []string{Netns}
	if !opts.Light {
		if err := checkUplink(opts); err != nil {
			return err
		}
		names = append(names, RouterNetns)
		for _, h := range labHosts(opts.Dir, opts.Hosts, Addressing{})[1:] { // their names only
			names = append(names, h.Netns)
		}
	}
	for _, ns := range names {
		_ = exec.Command("ip", "netns", "del", ns).Run()
		for _, args := range [][]string{{"netns", "add", ns}, {"-n", ns, "link", "set", "lo", "up"}} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
			}
		}
	}
	if opts.Light { // no guests, no pods: nothing to route
		return nil
	}
	return makeUplink(opts, cmp.Or[io.Writer](opts.Out, io.Discard))
}

// startOtherHosts starts every host but the first in its namespace
// (MakeNamespaces made it): its libvirtd and its network.
func (u *upRun) startOtherHosts(ctx context.Context) error {
	for i := 1; i < len(u.st.Hosts); i++ {
		h := &u.st.Hosts[i]
		p, err := h.private(u.st.Dir).Start(ctx, hostLibvirtdLog(u.st.Dir, h.Name))
		if err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
		h.Pids = map[string]int{"libvirtd": p.Pid()}
		if err := u.st.Save(); err != nil {
			return err
		}
		if err := u.st.CreateNetwork(*h); err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
		fmt.Fprintf(u.opts.Out, "           %s: namespace %s, libvirtd %s and sshd, bridge %s %s\n", h.Name, h.Netns, h.URI, Bridge, h.Address)
	}
	return nil
}

// stopOtherHosts removes every host but the first: guests, network, CCM
// replica, libvirtd and sshd, namespace.
func stopOtherHosts(st *State, out io.Writer) {
	hosts := st.LabHosts()
	for _, h := range hosts[1:] {
		h.signalAll(st, syscall.SIGCONT) // a lost host's frozen daemons answer again
		if pid := h.Pids[CCMProcess]; pid > 0 && host.IsProcess(pid, CCMProcess) {
			fmt.Fprintf(out, "stopping %s's CCM (pid %d)\n", h.Name, pid)
			host.Stop(pid)
		}
		removeGuestsOn(h.URI, out)
		h.private(st.Dir).Stop()
		if pid := h.Pids["libvirtd"]; pid > 0 && host.IsProcess(pid, "tini") {
			host.Stop(pid)
		}
		stopNamespace(h.Netns, 0, out)
	}
}

// stopNamespace stops whatever still runs in netns (dnsmasq, a crashed
// run's children) but keep, and deletes it.
func stopNamespace(netns string, keep int, out io.Writer) {
	if pids, err := exec.Command("ip", "netns", "pids", netns).Output(); err == nil {
		for _, f := range strings.Fields(string(pids)) {
			if pid, err := strconv.Atoi(f); err == nil && pid != keep {
				host.Stop(pid)
			}
		}
	}
	if err := exec.Command("ip", "netns", "del", netns).Run(); err == nil {
		fmt.Fprintf(out, "deleted network namespace %s\n", netns)
	}
}

// HostOfNode is the host a lab guest runs on.
func (s *State) HostOfNode(name string) (Host, error) {
	hosts := s.LabHosts()
	for i, n := range s.Nodes {
		if n == name {
			return hosts[hostOfGuest(i+1, len(hosts))-1], nil
		}
	}
	if len(hosts) == 1 {
		return hosts[0], nil
	}
	return Host{}, fmt.Errorf("node %s is not one of the lab's guests %v", name, s.Nodes)
}
