// Package lanprobe is a machine on a LAN, for what watches the lab's load
// balancers from outside (chaos, bench, the end-to-end tests): a network
// namespace of its own with a veth whose other end is a port of the LAN's
// bridge. It asks for addresses as a machine on the LAN does (ARP, HTTP,
// its kernel's neighbour discovery) and records the answers and the
// announcements that reach it (Capture); the host's own stack would not
// do, as an announcer answers none of the host's own requests. Listen
// records the same on any interface, such as the bridge itself.
package lanprobe

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Interface is the client's interface, in its namespace.
const Interface = "lan0"

// Options say where a client plugs in.
type Options struct {
	Bridge string // the LAN's bridge
	// BridgeNetns is the named network namespace the bridge is in; empty:
	// the calling thread's.
	BridgeNetns string
	// Port names the client's port on the bridge, its veth's other end; a
	// port of that name that a crashed run left is removed first.
	Port string
	// Addr is the client's address, and the LAN's prefix.
	Addr netip.Prefix
	// Netns names the client's namespace (/run/netns/NAME, which ip netns
	// exec enters); empty: one without a name, gone once closed.
	Netns string
}

// Client is a machine on the LAN. Close unplugs it.
type Client struct {
	opts     Options
	ns       netns.NsHandle // the client's
	bridgeNS netns.NsHandle
}

// New plugs a client into the LAN.
func New(opts Options) (*Client, error) {
	c := &Client{opts: opts, ns: netns.None()}
	var err error
	if opts.BridgeNetns == "" {
		c.bridgeNS, err = netns.Get()
	} else {
		c.bridgeNS, err = netns.GetFromName(opts.BridgeNetns)
	}
	if err != nil {
		return nil, fmt.Errorf("the bridge's network namespace %q: %w", opts.BridgeNetns, err)
	}
	h, err := netlink.NewHandleAt(c.bridgeNS)
	if err != nil {
		c.bridgeNS.Close()
		return nil, fmt.Errorf("netlink in the bridge's namespace: %w", err)
	}
	defer h.Close()
	if l, err := h.LinkByName(opts.Port); err == nil { // a crashed run's
		_ = h.LinkDel(l)
	}
	if opts.Netns != "" {
		_ = netns.DeleteNamed(opts.Netns) // a crashed run's
	}
	if c.ns, err = newNetns(opts.Netns); err == nil {
		err = c.plug(h)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// newNetns makes a network namespace, named when name is not empty,
// without entering it.
func newNetns(name string) (netns.NsHandle, error) {
	ns := netns.None()
	err := inNetns(func() (err error) {
		if name == "" {
			ns, err = netns.New()
		} else {
			ns, err = netns.NewNamed(name)
		}
		return err
	}, func() error { return nil })
	return ns, err
}

// plug adds the veth pair, one end a port of the bridge, the other with
// the client's address in the client's namespace.
func (c *Client) plug(h *netlink.Handle) error {
	o := c.opts
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: o.Port}, PeerName: Interface, PeerNamespace: netlink.NsFd(c.ns)}
	if err := h.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth %s: %w", o.Port, err)
	}
	br, err := h.LinkByName(o.Bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", o.Bridge, err)
	}
	if err := h.LinkSetMaster(veth, br); err != nil {
		return fmt.Errorf("attach %s to %s: %w", o.Port, o.Bridge, err)
	}
	if err := h.LinkSetUp(veth); err != nil {
		return fmt.Errorf("link up %s: %w", o.Port, err)
	}
	ch, peer, err := c.link()
	if err != nil {
		return err
	}
	defer ch.Close()
	addr, err := netlink.ParseAddr(o.Addr.String())
	if err != nil {
		return err
	}
	if err := ch.AddrAdd(peer, addr); err != nil {
		return fmt.Errorf("address %s on %s: %w", o.Addr, Interface, err)
	}
	if err := ch.LinkSetUp(peer); err != nil {
		return fmt.Errorf("link up %s: %w", Interface, err)
	}
	if lo, err := ch.LinkByName("lo"); err == nil {
		_ = ch.LinkSetUp(lo)
	}
	// The kernel lets a link carry frames once it has seen its carrier,
	// which it may do up to a second late (more on a busy host): until
	// then what the client sends is dropped.
	for _, end := range []struct {
		h    *netlink.Handle
		name string
	}{{h, o.Port}, {ch, Interface}} {
		if err := waitUp(end.h, end.name, linkUpBound); err != nil {
			return err
		}
	}
	return nil
}

// linkUpBound is how long New waits for the veth's ends to carry frames.
const linkUpBound = 10 * time.Second

// waitUp waits up to bound until link name is operationally up.
func waitUp(h *netlink.Handle, name string, bound time.Duration) error {
	for deadline := time.Now().Add(bound); ; time.Sleep(10 * time.Millisecond) {
		l, err := h.LinkByName(name)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if l.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not up after %s: %s", name, bound, l.Attrs().OperState)
		}
	}
}

// Close removes the veth pair and the client's namespace.
func (c *Client) Close() error {
	var errs []error
	if h, err := netlink.NewHandleAt(c.bridgeNS); err == nil {
		if l, err := h.LinkByName(c.opts.Port); err == nil {
			errs = append(errs, h.LinkDel(l))
		}
		h.Close()
	}
	if c.ns.IsOpen() {
		if c.opts.Netns != "" {
			errs = append(errs, netns.DeleteNamed(c.opts.Netns))
		}
		errs = append(errs, c.ns.Close())
	}
	return errors.Join(append(errs, c.bridgeNS.Close())...)
}

// Netns is the client's namespace's name, empty for one without.
func (c *Client) Netns() string { return c.opts.Netns }

// Addr is the client's address on the LAN.
func (c *Client) Addr() netip.Addr { return c.opts.Addr.Addr() }

// link is a netlink handle in the client's namespace, which the caller
// closes, and the client's interface.
func (c *Client) link() (*netlink.Handle, netlink.Link, error) {
	h, err := netlink.NewHandleAt(c.ns)
	if err != nil {
		return nil, nil, fmt.Errorf("netlink in the client's namespace: %w", err)
	}
	l, err := h.LinkByName(Interface)
	if err != nil {
		h.Close()
		return nil, nil, fmt.Errorf("%s: %w", Interface, err)
	}
	return h, l, nil
}

// MAC is the client's interface's.
func (c *Client) MAC() (net.HardwareAddr, error) {
	h, l, err := c.link()
	if err != nil {
		return nil, err
	}
	h.Close()
	return l.Attrs().HardwareAddr, nil
}

// Neighbour is the MAC the client's kernel holds for ip (learnt by ARP
// or NDP), nil without a usable entry.
func (c *Client) Neighbour(ip netip.Addr) (net.HardwareAddr, error) {
	h, link, err := c.link()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	family := netlink.FAMILY_V4
	if ip.Is6() {
		family = netlink.FAMILY_V6
	}
	list, err := h.NeighList(link.Attrs().Index, family)
	if err != nil {
		return nil, err
	}
	for _, n := range list {
		if n.IP.Equal(ip.AsSlice()) && len(n.HardwareAddr) == 6 && n.State&(netlink.NUD_FAILED|netlink.NUD_INCOMPLETE) == 0 {
			return n.HardwareAddr, nil
		}
	}
	return nil, nil
}

// Do runs fn on a thread in the client's namespace: sockets fn opens stay
// there.
func (c *Client) Do(fn func() error) error {
	return inNetns(func() error { return netns.Set(c.ns) }, fn)
}

// inNetns runs fn on a thread that enter switches into a network
// namespace, and switches the thread back before releasing it. A thread
// that cannot be switched back stays locked and ends with its goroutine,
// so that nothing else runs in the wrong namespace; no thread ends
// otherwise, as processes started with Pdeathsig die with the thread that
// started them.
func inNetns(enter, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := enter(); err != nil {
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
			errc <- fmt.Errorf("enter the client's network namespace: %w", err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("leave the client's network namespace: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
