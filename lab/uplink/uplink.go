// Package uplink joins the lab's network namespace to the host's, as
// Docker's bridge joins kind's nodes: a veth pair on a transit /30 (and
// link-local IPv6), routes in the host's namespace to everything the lab
// has, a default route in the lab's namespace back to the host, and NAT in
// the host's namespace so the lab reaches what the host reaches. Every
// route carries Protocol and every nftables object is ours by name or tag,
// so Remove finds them all even when no record of them survived.
package uplink

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const (
	// HostLink is the host's end of the veth, LabLink the lab's (both
	// within IFNAMSIZ's 15 characters).
	HostLink = "labcloud0"
	LabLink  = "lcuplink0"
	// Protocol marks the uplink's routes ("proto 85" in ip route; 85 is
	// ASCII 'U'), apart from netroutes' 76 and 77 and every rt_protos
	// value.
	Protocol netlink.RouteProtocol = 85
)

// The transit between the two ends: a /30 out of 169.254.0.0/16 (no
// host has a neighbour there) and fixed link-local IPv6 addresses.
var (
	Transit  = netip.MustParsePrefix("169.254.123.0/30")
	hostAddr = netip.MustParseAddr("169.254.123.1")
	labAddr  = netip.MustParseAddr("169.254.123.2")
	hostLL   = netip.MustParseAddr("fe80::1")
	labLL    = netip.MustParseAddr("fe80::2")
)

// Named is one of the lab's prefixes and what it is, as an error names it
// ("the lab's pod CIDRs"), with the flag of labcloud up that moves it
// (none: fixed).
type Named struct {
	What   string
	Prefix netip.Prefix
	Flag   string
}

// Plan is what the uplink carries: the lab's prefixes, each routed from
// the host into the lab (IPv4 ones also masqueraded on their way out), and
// whether the lab has IPv6 (then the ends get link-local addresses and the
// lab an IPv6 default route).
type Plan struct {
	Prefixes []Named
	IPv6     bool
}

// Record is what Setup did that Remove cannot find by name: whether it
// turned IPv4 forwarding on in the host's namespace (Remove turns it back
// off only then).
type Record struct {
	TurnedOnForwarding bool `json:"turnedOnForwarding,omitempty"`
}

// Made is Setup's result: the record to keep, and what the user should be
// told (forwarding turned on, foreign chains opened, rules to add by hand).
type Made struct {
	Record Record
	Notes  []string
}

// Setup makes the uplink between hostNS and labNS for p. On error it
// removes what it made.
func Setup(hostNS, labNS netns.NsHandle, p Plan) (Made, error) {
	m, err := setup(hostNS, labNS, p)
	if err != nil {
		return Made{}, errors.Join(err, Remove(hostNS, m.Record))
	}
	return m, nil
}

func setup(hostNS, labNS netns.NsHandle, p Plan) (Made, error) {
	var m Made
	h, err := netlink.NewHandleAt(hostNS)
	if err != nil {
		return m, fmt.Errorf("netlink in the host's namespace: %w", err)
	}
	defer h.Close()
	l, err := netlink.NewHandleAt(labNS)
	if err != nil {
		return m, fmt.Errorf("netlink in the lab's namespace: %w", err)
	}
	defer l.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: HostLink}, PeerName: LabLink, PeerNamespace: netlink.NsFd(labNS)}
	if err := h.LinkAdd(veth); err != nil {
		return m, fmt.Errorf("veth %s-%s: %w", HostLink, LabLink, err)
	}
	hostEnd, err := end(h, HostLink, hostAddr, hostLL, p.IPv6)
	if err != nil {
		return m, err
	}
	labEnd, err := end(l, LabLink, labAddr, labLL, p.IPv6)
	if err != nil {
		return m, err
	}
	for _, n := range p.Prefixes {
		via := labAddr
		if n.Prefix.Addr().Is6() {
			via = labLL
		}
		if err := addRoute(h, hostEnd, n.Prefix, via); err != nil {
			return m, fmt.Errorf("route to %s (%s): %w", n.Prefix, n.What, err)
		}
	}
	defaults := []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}
	sysctls := []string{"net/ipv4/ip_forward"}
	if p.IPv6 {
		defaults = append(defaults, netip.MustParsePrefix("::/0"))
		sysctls = append(sysctls, "net/ipv6/conf/all/forwarding")
	}
	for _, d := range defaults {
		via := hostAddr
		if d.Addr().Is6() {
			via = hostLL
		}
		if err := addRoute(l, labEnd, d, via); err != nil {
			return m, fmt.Errorf("the lab's default route: %w", err)
		}
	}
	for _, s := range sysctls { // the lab's namespace is ours: forwarding on
		if _, err := setSysctl(labNS, s, "1"); err != nil {
			return m, err
		}
	}
	// Forwarding in the host's namespace before NAT: IPv4 only. IPv6
	// forwarding would make the host ignore router advertisements.
	old, err := setSysctl(hostNS, "net/ipv4/ip_forward", "1")
	if err != nil {
		return m, err
	}
	if old == "0" {
		m.Record.TurnedOnForwarding = true
		m.Notes = append(m.Notes, "turned on IPv4 forwarding in the host's namespace (net.ipv4.ip_forward=1), as Docker does, for the lab's traffic out; labcloud down turns it off again")
	}
	notes, err := addNAT(hostNS, masqueraded(p))
	m.Notes = append(m.Notes, notes...)
	if err != nil {
		return m, err
	}
	return m, nil
}

// masqueraded are the IPv4 sources NAT hides behind the host: the lab's
// IPv4 prefixes and the transit (the lab's namespace's own traffic).
func masqueraded(p Plan) []netip.Prefix {
	out := []netip.Prefix{Transit}
	for _, n := range p.Prefixes {
		if n.Prefix.Addr().Is4() {
			out = append(out, n.Prefix)
		}
	}
	return out
}

// end brings up one end of the veth with its transit addresses.
func end(h *netlink.Handle, name string, v4, ll netip.Addr, ipv6 bool) (netlink.Link, error) {
	link, err := h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	addrs := []netip.Prefix{netip.PrefixFrom(v4, Transit.Bits())}
	if ipv6 {
		addrs = append(addrs, netip.PrefixFrom(ll, 64))
	}
	for _, a := range addrs {
		addr := &netlink.Addr{IPNet: ipNet(a)}
		if a.Addr().Is6() {
			addr.Flags = unix.IFA_F_NODAD // both ends are ours: no duplicate to detect
		}
		if err := h.AddrAdd(link, addr); err != nil {
			return nil, fmt.Errorf("address %s on %s: %w", a, name, err)
		}
	}
	if err := h.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("%s up: %w", name, err)
	}
	return link, nil
}

func addRoute(h *netlink.Handle, link netlink.Link, dst netip.Prefix, via netip.Addr) error {
	return h.RouteAdd(&netlink.Route{
		LinkIndex: link.Attrs().Index, Dst: ipNet(dst), Gw: net.IP(via.AsSlice()), Protocol: Protocol,
	})
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Remove removes the uplink from hostNS: the veth (its lab end goes with
// it), every route of Protocol, our nftables table and our tagged rules
// in other tables; forwarding goes off if rec says Setup turned it on. It
// is safe when nothing or part of it is there.
func Remove(hostNS netns.NsHandle, rec Record) error {
	h, err := netlink.NewHandleAt(hostNS)
	if err != nil {
		return fmt.Errorf("netlink in the host's namespace: %w", err)
	}
	defer h.Close()
	var errs []error
	if link, err := h.LinkByName(HostLink); err == nil {
		if err := h.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", HostLink, err))
		}
	}
	routes, err := ours(h)
	errs = append(errs, err)
	for _, r := range routes {
		if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s: %w", r.Dst, err))
		}
	}
	errs = append(errs, removeNAT(hostNS))
	if rec.TurnedOnForwarding {
		if _, err := setSysctl(hostNS, "net/ipv4/ip_forward", "0"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ours are the routes of Protocol in every table of both families.
func ours(h *netlink.Handle) ([]netlink.Route, error) {
	filter := &netlink.Route{Protocol: Protocol, Table: unix.RT_TABLE_UNSPEC}
	var out []netlink.Route
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := h.RouteListFiltered(fam, filter, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		out = append(out, rs...)
	}
	return out, nil
}

// setSysctl writes value to /proc/sys/<key> in ns and returns what was
// there. /proc/sys/net is the namespace of the thread that opens it.
func setSysctl(ns netns.NsHandle, key, value string) (string, error) {
	var old string
	err := inNS(ns, func() error {
		p := "/proc/sys/" + key
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		old = strings.TrimSpace(string(b))
		if old == value {
			return nil
		}
		return os.WriteFile(p, []byte(value), 0o644)
	})
	if err != nil {
		return "", fmt.Errorf("sysctl %s=%s: %w", strings.ReplaceAll(key, "/", "."), value, err)
	}
	return old, nil
}

// inNS runs f on a thread in ns. A thread that cannot return to its own
// namespace is not unlocked, so Go ends it instead of reusing it.
func inNS(ns netns.NsHandle, f func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := f()
	if err := netns.Set(orig); err != nil {
		return errors.Join(ferr, err)
	}
	runtime.UnlockOSThread()
	return ferr
}
