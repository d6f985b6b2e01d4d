package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/labcloud/labcloud/lab/lanprobe"
)

// The bench's failover figures come from what the bridge carries, not from
// the CCM's log: a capture on the bridge (lanprobe.Listen) sees every
// announcement the announcer sends for a VIP, gratuitous ARP for IPv4 and
// unsolicited Neighbor Advertisements for IPv6 (its socket takes all
// protocols, since the kernel hands frames a host sends only to such
// sockets), and a netlink subscription sees every change of the hosts'
// neighbour entries for it. Both are stamped when they reach this process.

// wireWatch records, for one VIP on one bridge, its announcements and the
// neighbour entry updates, in the network namespaces it was opened for.
type wireWatch struct {
	vip     netip.Addr
	capture *lanprobe.Capture // the bridge's

	mu     sync.Mutex
	neighs []lanprobe.Frame
	err    error // the first error that ended the neighbour watch

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
	capture, err := lanprobe.Listen(ifi, netip.Addr{})
	if err != nil {
		return nil, err
	}
	w := &wireWatch{vip: vip.Unmap(), capture: capture, stopNeigh: make(chan struct{})}
	if err := w.watchNeighbours(nil, ifi.Index); err != nil {
		capture.Close()
		return nil, err
	}
	for _, name := range others {
		if err := w.watchNeighboursIn(name, bridge); err != nil {
			_ = w.Close()
			return nil, err
		}
	}
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
			w.record(lanprobe.Frame{At: at, IP: ip.Unmap(), MAC: bytes.Clone(u.HardwareAddr)})
		}
	}()
	return nil
}

func (w *wireWatch) record(s lanprobe.Frame) {
	w.mu.Lock()
	w.neighs = append(w.neighs, s)
	w.mu.Unlock()
}

func (w *wireWatch) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
}

// firstGARP is the first announcement of the VIP seen at or after since
// whose MAC is not other (the node that stopped answering).
func (w *wireWatch) firstGARP(since time.Time, other net.HardwareAddr) (lanprobe.Frame, bool) {
	return firstNot(w.capture.Announced(w.vip, nil, since), other)
}

// firstNeighbour is the first update of the host's neighbour entry for the
// VIP at or after since that names a MAC other than other.
func (w *wireWatch) firstNeighbour(since time.Time, other net.HardwareAddr) (lanprobe.Frame, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var after []lanprobe.Frame
	for _, s := range w.neighs {
		if !s.At.Before(since) {
			after = append(after, s)
		}
	}
	return firstNot(after, other)
}

// firstNot is the first of seen that names a MAC other than other.
func firstNot(seen []lanprobe.Frame, other net.HardwareAddr) (lanprobe.Frame, bool) {
	for _, s := range seen {
		if !bytes.Equal(s.MAC, other) {
			return s, true
		}
	}
	return lanprobe.Frame{}, false
}

// wait returns once find reports an observation or ctx ends, with the
// error that ended a watch, if one did. The observation carries its own
// arrival time: how often this polls does not change the figures.
func (w *wireWatch) wait(ctx context.Context, find func() (lanprobe.Frame, bool)) (lanprobe.Frame, error) {
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
			return lanprobe.Frame{}, errors.Join(ctx.Err(), err, w.capture.Err())
		case <-t.C:
		}
	}
}

// Close stops both watches and waits for them.
func (w *wireWatch) Close() error {
	err := w.capture.Close()
	close(w.stopNeigh)
	w.wg.Wait()
	return err
}
