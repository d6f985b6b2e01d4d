package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The bench's failover figures come from what the bridge carries, not from
// the CCM's log: a raw packet socket on the bridge sees every announcement
// the announcer sends for a VIP, gratuitous ARP for IPv4 and unsolicited
// Neighbor Advertisements for IPv6 (the socket takes all protocols, since
// the kernel hands frames a host sends only to such sockets), and a netlink
// subscription sees every change of the hosts' neighbour entries for it.
// Both are stamped when they reach this process.

// wireSeen is one observation: when, and the MAC it names.
type wireSeen struct {
	At  time.Time
	MAC net.HardwareAddr
}

// wireWatch records, for one VIP on one bridge, its announcements (for
// IPv4 a gratuitous ARP, request or reply form: sender and target address
// are both the VIP; for IPv6 an unsolicited Neighbor Advertisement with the
// override flag) and the neighbour entry updates, in the network namespaces
// it was opened for.
type wireWatch struct {
	vip netip.Addr

	mu     sync.Mutex
	garps  []wireSeen
	neighs []wireSeen
	err    error // the first error that ended one of the two watches

	conn      *packet.Conn
	closing   atomic.Bool
	stopNeigh chan struct{}
	wg        sync.WaitGroup
}

// watchWire starts watching the bridge for vip. Close ends it. The
// neighbour entries are watched in this network namespace and in each of
// others (other hosts' namespaces, each with a bridge of the same name):
// each host's replica writes the entries of its own nodes' VIPs.
func watchWire(bridge string, vip netip.Addr, others ...string) (*wireWatch, error) {
	ifi, err := net.InterfaceByName(bridge)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", bridge, err)
	}
	conn, err := packet.Listen(ifi, packet.Raw, unix.ETH_P_ALL, nil)
	if err != nil {
		return nil, fmt.Errorf("capture on %s: %w", bridge, err)
	}
	w := &wireWatch{vip: vip.Unmap(), conn: conn, stopNeigh: make(chan struct{})}
	if err := w.watchNeighbours(nil, ifi.Index); err != nil {
		conn.Close()
		return nil, err
	}
	for _, name := range others {
		if err := w.watchNeighboursIn(name, bridge); err != nil {
			_ = w.Close()
			return nil, err
		}
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		w.capture()
	}()
	return w, nil
}

// watchNeighboursIn watches the neighbour entries on bridge in the named
// network namespace.
func (w *wireWatch) watchNeighboursIn(name, bridge string) error {
	ns, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", name, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", name, err)
	}
	defer h.Close()
	link, err := h.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("bridge %s in %s: %w", bridge, name, err)
	}
	return w.watchNeighbours(&ns, link.Attrs().Index)
}

// watchNeighbours records the updates of the VIP's neighbour entry on the
// link index of the namespace ns (nil: this one).
func (w *wireWatch) watchNeighbours(ns *netns.NsHandle, index int) error {
	updates := make(chan netlink.NeighUpdate, 256)
	err := netlink.NeighSubscribeWithOptions(updates, w.stopNeigh, netlink.NeighSubscribeOptions{
		Namespace:     ns,
		ErrorCallback: func(err error) { w.fail(fmt.Errorf("neighbour updates: %w", err)) },
	})
	if err != nil {
		return fmt.Errorf("subscribe to neighbour updates: %w", err)
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for u := range updates {
			at := time.Now()
			ip, ok := netip.AddrFromSlice(u.IP)
			if u.Type != unix.RTM_NEWNEIGH || u.LinkIndex != index || !ok || ip.Unmap() != w.vip || len(u.HardwareAddr) == 0 {
				continue
			}
			w.record(&w.neighs, wireSeen{At: at, MAC: bytes.Clone(u.HardwareAddr)})
		}
	}()
	return nil
}

// capture reads frames until the socket is closed.
func (w *wireWatch) capture() {
	buf := make([]byte, 1600)
	for {
		n, _, err := w.conn.ReadFrom(buf)
		at := time.Now()
		if err != nil {
			if !w.closing.Load() {
				w.fail(fmt.Errorf("capture: %w", err))
			}
			return
		}
		if mac, ok := announcementFor(buf[:n], w.vip); ok {
			w.record(&w.garps, wireSeen{At: at, MAC: mac})
		}
	}
}

// announcementFor parses an Ethernet frame and reports whether it announces
// vip, and the MAC it names.
func announcementFor(frame []byte, vip netip.Addr) (net.HardwareAddr, bool) {
	var f ethernet.Frame
	if err := f.UnmarshalBinary(frame); err != nil {
		return nil, false
	}
	switch f.EtherType {
	case ethernet.EtherTypeARP:
		var p arp.Packet
		if err := p.UnmarshalBinary(f.Payload); err != nil || p.SenderIP != vip || p.TargetIP != vip {
			return nil, false
		}
		return p.SenderHardwareAddr, true
	case ethernet.EtherTypeIPv6:
		const ipv6Header = 40
		if len(f.Payload) < ipv6Header || f.Payload[6] != unix.IPPROTO_ICMPV6 {
			return nil, false
		}
		m, err := ndp.ParseMessage(f.Payload[ipv6Header:])
		na, ok := m.(*ndp.NeighborAdvertisement)
		if err != nil || !ok || na.Solicited || !na.Override || na.TargetAddress != vip {
			return nil, false
		}
		for _, o := range na.Options {
			if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Target {
				return lla.Addr, true
			}
		}
	}
	return nil, false
}

func (w *wireWatch) record(list *[]wireSeen, s wireSeen) {
	w.mu.Lock()
	*list = append(*list, s)
	w.mu.Unlock()
}

func (w *wireWatch) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
}

// firstGARP is the first gratuitous ARP for the VIP seen at or after since
// whose sender MAC is not other (the node that stopped answering).
func (w *wireWatch) firstGARP(since time.Time, other net.HardwareAddr) (wireSeen, bool) {
	return w.first(&w.garps, since, other)
}

// firstNeighbour is the first update of the host's neighbour entry for the
// VIP at or after since that names a MAC other than other.
func (w *wireWatch) firstNeighbour(since time.Time, other net.HardwareAddr) (wireSeen, bool) {
	return w.first(&w.neighs, since, other)
}

func (w *wireWatch) first(list *[]wireSeen, since time.Time, other net.HardwareAddr) (wireSeen, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range *list {
		if !s.At.Before(since) && !bytes.Equal(s.MAC, other) {
			return s, true
		}
	}
	return wireSeen{}, false
}

// wait returns once find reports an observation or ctx ends, with the
// error that ended a watch, if one did. The observation carries its own
// arrival time: how often this polls does not change the figures.
func (w *wireWatch) wait(ctx context.Context, find func() (wireSeen, bool)) (wireSeen, error) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if s, ok := find(); ok {
			return s, nil
		}
		select {
		case <-ctx.Done():
			w.mu.Lock()
			err := w.err
			w.mu.Unlock()
			return wireSeen{}, errors.Join(ctx.Err(), err)
		case <-t.C:
		}
	}
}

// Close stops both watches and waits for them.
func (w *wireWatch) Close() error {
	w.closing.Store(true)
	err := w.conn.Close()
	close(w.stopNeigh)
	w.wg.Wait()
	return err
}
