package announce

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
	"k8s.io/klog/v2"
)

// The host reaches a VIP through a permanent neighbour entry on the bridge
// (vip lladdr mac), installed for each owned VIP. The entries double as
// the host's record of what was announced, which outlives this process
// (see Recorded).

// installNeighbour installs vip's entry and notes whether it is in place.
// Callers hold changeMu.
func (a *Announcer) installNeighbour(vip netip.Addr, mac net.HardwareAddr) error {
	if err := a.neigh.NeighSet(a.neighbour(vip, mac)); err != nil {
		a.neighOK[vip] = false
		return fmt.Errorf("installing neighbour %s lladdr %s on %s: %w", vip, mac, a.name, err)
	}
	a.neighOK[vip] = true
	return nil
}

// deleteNeighbour deletes vip's entry, even if this process never set it:
// a previous run may have. Callers hold changeMu.
func (a *Announcer) deleteNeighbour(vip netip.Addr) error {
	err := a.neigh.NeighDel(a.neighbour(vip, nil))
	if err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("deleting neighbour %s on %s: %w", vip, a.name, err)
	}
	return nil
}

// syncNeighbours re-installs every owned VIP's neighbour entry (the kernel
// flushes them, permanent ones too, when the bridge goes down). It returns the
// first error and how many failed.
func (a *Announcer) syncNeighbours() (int, error) {
	a.changeMu.Lock()
	defer a.changeMu.Unlock()
	var first error
	failed := 0
	for vip, c := range a.table() {
		if err := a.installNeighbour(vip, c.mac); err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	return failed, first
}

// resync re-installs the neighbour entries and re-joins the groups.
func (a *Announcer) resync(ctx context.Context) {
	if failed, err := a.syncNeighbours(); err != nil {
		klog.FromContext(ctx).Error(err, "Re-installing host neighbour entries", "failed", failed)
	}
	a.changeMu.Lock()
	err := a.syncGroups()
	a.changeMu.Unlock()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Joining the IPv6 VIPs' solicited-node groups")
	}
}

// forget marks every neighbour entry and group as missing, for the next
// Set or refresh to install: they were on a bridge that is gone.
func (a *Announcer) forget() {
	a.changeMu.Lock()
	clear(a.neighOK)
	a.joined = joinedGroups{}
	a.changeMu.Unlock()
}

func (a *Announcer) neighbour(vip netip.Addr, mac net.HardwareAddr) *netlink.Neigh {
	family := netlink.FAMILY_V4
	if vip.Is6() {
		family = netlink.FAMILY_V6
	}
	return &netlink.Neigh{
		LinkIndex:    a.bridge.Load().index,
		Family:       family,
		State:        netlink.NUD_PERMANENT,
		IP:           net.IP(vip.AsSlice()),
		HardwareAddr: mac,
	}
}

// Recorded reads the host's permanent neighbour entries on the bridge: the
// durable record, kept by the kernel across a restart of this process, of
// what the last announcer installed (VIP → MAC of the answering node).
func (a *Announcer) Recorded() (map[netip.Addr]net.HardwareAddr, error) {
	var list []netlink.Neigh
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		l, err := a.neigh.NeighList(a.bridge.Load().index, family)
		if err != nil {
			return nil, fmt.Errorf("listing neighbours on %s: %w", a.name, err)
		}
		list = append(list, l...)
	}
	out := map[netip.Addr]net.HardwareAddr{}
	for _, n := range list {
		if n.State&netlink.NUD_PERMANENT == 0 || len(n.HardwareAddr) != 6 {
			continue
		}
		if ip, ok := netip.AddrFromSlice(n.IP); ok {
			out[ip.Unmap()] = bytes.Clone(n.HardwareAddr)
		}
	}
	return out, nil
}
