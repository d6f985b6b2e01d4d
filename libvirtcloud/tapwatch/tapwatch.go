// Package tapwatch follows the host's bridge ports over rtnetlink and says
// when one leaves its bridge (deleted, released, or without carrier) and
// when one is back: the first sign, on the host, that a guest's QEMU died.
// Every link with a master counts as a port (the listing may name a port
// before its bridge); the handler knows which names are guests' taps.
package tapwatch

import (
	"context"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/internal/linkwatch"
)

// Handler is told of ports leaving a bridge and coming back.
type Handler interface {
	// TapGone: the port dev was deleted, released from its bridge or lost
	// its carrier at at (when the message was read).
	TapGone(dev string, at time.Time)
	// TapBack: dev is on a bridge again, with carrier.
	TapBack(dev string)
}

// port is what the watch knows of one bridge port.
type port struct {
	name string
	up   bool // on its bridge, with carrier
}

// Watch follows the ports of the process's network namespace until ctx
// ends, telling h. It returns once subscribed. After a broken subscription
// it starts over from the new listing: a port gone meanwhile is no longer
// listed, and libvirt's own event covers it.
func Watch(ctx context.Context, h Handler) error {
	ports := map[int]port{} // link index → the port, since it had a master
	err := linkwatch.Follow(ctx, "bridge ports", func(updates chan netlink.LinkUpdate, done chan struct{}) error {
		return netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
			ListExisting:  true,
			ErrorCallback: func(err error) { klog.FromContext(ctx).V(2).Info("Bridge port updates", "err", err) },
		})
	}, linkwatch.Handlers{
		Update:       func(u netlink.LinkUpdate) { follow(u, ports, h) },
		Resubscribed: func() { clear(ports) },
	})
	if err != nil {
		return fmt.Errorf("watch bridge ports: %w", err)
	}
	return nil
}

// follow applies one link message: what it says of a port, told to h.
func follow(u netlink.LinkUpdate, ports map[int]port, h Handler) {
	attrs := u.Link.Attrs()
	p, was := ports[attrs.Index]
	// A bridge tells of a port released from it with a DELLINK of family
	// AF_BRIDGE: the link itself lives on.
	released := u.Header.Type == unix.RTM_DELLINK && u.Family == unix.AF_BRIDGE
	if u.Header.Type == unix.RTM_DELLINK && !released {
		delete(ports, attrs.Index)
		if was && p.up {
			h.TapGone(p.name, time.Now())
		}
		return
	}
	if !was && (attrs.MasterIndex == 0 || released) {
		return // never a port: not ours to follow
	}
	// A tap QEMU holds open has carrier; its operational state is "up" or,
	// for many drivers, "unknown". A port released from its bridge is
	// followed on, so that it can be told back.
	up := !released && attrs.MasterIndex != 0 &&
		(attrs.OperState == netlink.OperUp || attrs.OperState == netlink.OperUnknown && attrs.RawFlags&unix.IFF_LOWER_UP != 0)
	ports[attrs.Index] = port{name: attrs.Name, up: up}
	switch {
	case was && p.up && !up:
		h.TapGone(attrs.Name, time.Now())
	case was && !p.up && up:
		h.TapBack(attrs.Name)
	}
}
