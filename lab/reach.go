package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vishvananda/netns"
	"go4.org/netipx"

	"github.com/labcloud/labcloud/lab/uplink"
)

// uplinkPlan is what a full lab of opts routes from the host: every
// host's network, the VIP pools outside them, the pod CIDRs, of the
// lab's families (the lab's network always has IPv4), each with the flag
// that moves it (IPv6's are fixed).
func uplinkPlan(opts Options) uplink.Plan {
	f := opts.IPFamily.orIPv4()
	a, _ := opts.addressingErr() // Validate has refused what does not parse
	var out []uplink.Named
	add := func(what, flag, prefix string) {
		out = append(out, uplink.Named{What: what, Prefix: netip.MustParsePrefix(prefix), Flag: flag})
	}
	if opts.Routed {
		l := a.lan()
		for k := 1; k <= max(opts.Hosts, 1); k++ {
			add(fmt.Sprintf("network of host %d", k), flagSubnet, l.Subnet(k)+".0/24")
		}
		add("LAN", flagSubnet, l.Uplink(0)+"/24")
		add("VIP pool", flagSubnet, covering(l.VIPPool()).String())
	} else {
		add("network", flagSubnet, a.Network().String()) // the VIP pool is in it
	}
	if f != IPv6 {
		add("pod CIDRs", flagPodCIDR, a.ClusterCIDR())
	}
	if f.HasIPv6() {
		add("IPv6 network", "", Subnet6)
		add("IPv6 pod CIDRs", "", ClusterCIDR6)
	}
	return uplink.Plan{Prefixes: out, IPv6: f.HasIPv6()}
}

// covering is the smallest prefix that holds the range "from-to": one
// route for the pool, not one per aligned block.
func covering(r string) netip.Prefix {
	ipr := netipx.MustParseIPRange(r)
	p := netip.PrefixFrom(ipr.From(), ipr.From().BitLen())
	for !p.Contains(ipr.To()) {
		p, _ = p.Addr().Prefix(p.Bits() - 1)
	}
	return p
}

func uplinkRecordPath(dir string) string { return filepath.Join(dir, "uplink.json") }

// readUplinkRecord is what the last up's uplink recorded in dir; none
// (a zero record) when it made none.
func readUplinkRecord(dir string) uplink.Record {
	var rec uplink.Record
	if b, err := os.ReadFile(uplinkRecordPath(dir)); err == nil {
		_ = json.Unmarshal(b, &rec)
	}
	return rec
}

// checkUplink removes a crashed lab's uplink from the host's namespace
// (this thread's) and refuses a lab whose prefixes overlap the host's
// routes, before anything is made.
func checkUplink(opts Options) error {
	host, err := netns.Get()
	if err != nil {
		return err
	}
	defer host.Close()
	if err := uplink.Remove(host, readUplinkRecord(opts.Dir)); err != nil {
		return fmt.Errorf("remove a previous lab's uplink: %w", err)
	}
	return uplink.Check(host, uplinkPlan(opts))
}

// makeUplink joins the lab's namespace to the host's (this thread's) and
// records it in opts.Dir (the record is up's: the lab's own state is
// written inside the lab's namespace), saying on out what it changed.
func makeUplink(opts Options, out io.Writer) error {
	host, err := netns.Get()
	if err != nil {
		return err
	}
	defer host.Close()
	labNS, err := netns.GetFromName(Netns)
	if err != nil {
		return fmt.Errorf("namespace %s: %w", Netns, err)
	}
	defer labNS.Close()
	m, err := uplink.Setup(host, labNS, uplinkPlan(opts))
	if err != nil {
		return fmt.Errorf("uplink: %w", err)
	}
	b, _ := json.Marshal(m.Record)
	err = errors.Join(os.MkdirAll(opts.Dir, 0o700), os.WriteFile(uplinkRecordPath(opts.Dir), b, 0o600))
	if err != nil {
		err = errors.Join(err, uplink.Remove(host, m.Record))
		return fmt.Errorf("record the uplink: %w", err)
	}
	fmt.Fprintf(out, "uplink %s (host) - %s (lab): the lab's addresses are routed from this host, and the lab reaches out through it (NAT, nftables table inet %s)\n", uplink.HostLink, uplink.LabLink, uplink.Table)
	for _, n := range m.Notes {
		fmt.Fprintf(out, "           %s\n", n)
	}
	return nil
}

// removeUplink removes the uplink from the host's namespace (this
// thread's), found by name and protocol, the record saying whether
// forwarding goes off.
func removeUplink(dir string, out io.Writer) error {
	host, err := netns.Get()
	if err != nil {
		return err
	}
	defer host.Close()
	_, had := net.InterfaceByName(uplink.HostLink)
	if err := uplink.Remove(host, readUplinkRecord(dir)); err != nil {
		return fmt.Errorf("remove the uplink: %w", err)
	}
	if had == nil {
		fmt.Fprintf(out, "removed the uplink %s, its routes and nftables rules\n", uplink.HostLink)
	}
	return nil
}

// openLabForwarding lets the uplink's traffic through the firewalls in
// the lab's namespace (this thread's): libvirt's network rejects
// forwarding to and from its bridge for addresses outside its subnet,
// pod CIDRs included. Run after the lab's network is created.
func openLabForwarding() error {
	ns, err := netns.Get()
	if err != nil {
		return err
	}
	defer ns.Close()
	_, err = uplink.OpenForwarding(ns, uplink.LabLink)
	return err
}
