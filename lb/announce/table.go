package announce

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"time"
)

// choice is the MAC chosen to answer for one VIP. A published choice never
// changes but for its guard: a new MAC, or the VIP set again after Remove,
// is a new choice, which is how the announce loop tells a move from a
// repeat.
type choice struct {
	mac    net.HardwareAddr
	rounds int       // gratuitous rounds that announce it: Count, or 0 if adopted
	cause  time.Time // the event that moved the VIP here (see SetAfter), or zero
	guard  guard     // defences against other hosts' claims; see defend.go
}

// vipTable is every owned VIP's choice. A published table is never
// changed; a change publishes a changed copy.
type vipTable map[netip.Addr]*choice

// table returns the published table, to read only.
func (a *Announcer) table() vipTable { return *a.vips.Load() }

// change publishes a copy of the table with edit applied. Callers hold
// changeMu.
func (a *Announcer) change(edit func(vipTable)) {
	t := maps.Clone(a.table())
	edit(t)
	macs := make(map[string]bool, len(t))
	for _, c := range t {
		macs[string(c.mac)] = true
	}
	a.wireMu.Lock()
	a.vips.Store(&t)
	a.answerMACs = macs
	a.wireMu.Unlock()
}

// Owned returns the MAC that answers for vip, if vip is owned.
func (a *Announcer) Owned(vip netip.Addr) (net.HardwareAddr, bool) {
	c, ok := a.table()[vip.Unmap()]
	if !ok {
		return nil, false
	}
	return bytes.Clone(c.mac), true
}

// Answering returns every owned VIP and the MAC that answers for it.
func (a *Announcer) Answering() map[netip.Addr]net.HardwareAddr {
	t := a.table()
	out := make(map[netip.Addr]net.HardwareAddr, len(t))
	for vip, c := range t {
		out[vip] = bytes.Clone(c.mac)
	}
	return out
}

// Set makes mac (the chosen node's NIC) answer for vip from now on. A new VIP
// or a changed MAC is announced with gratuitous ARP by Run, starting at once,
// without blocking the caller; setting the same vip and mac again does nothing.
// The host neighbour entry (vip lladdr mac dev bridge nud permanent) is
// installed before Set returns; if that fails the VIP is still answered, the
// error is returned, and the entry is retried by the next Set and by the
// periodic refresh.
func (a *Announcer) Set(vip netip.Addr, mac net.HardwareAddr) error {
	return a.SetAfter(vip, mac, time.Time{})
}

// SetAfter is Set for a VIP that moves to mac because of an event at cause
// (a libvirt lifecycle event of the domain that answered before): the time
// from cause to the first gratuitous ARP frame sent for the move is
// observed in labcloud_lb_failover_seconds. A zero cause observes nothing.
func (a *Announcer) SetAfter(vip netip.Addr, mac net.HardwareAddr, cause time.Time) error {
	vip = vip.Unmap()
	if err := validVIP(vip); err != nil {
		return err
	}
	if len(mac) != 6 || mac[0]&1 != 0 || bytes.Equal(mac, make(net.HardwareAddr, 6)) {
		return fmt.Errorf("announce: %q is not a unicast Ethernet address", mac)
	}
	mac = bytes.Clone(mac)

	a.changeMu.Lock()
	defer a.changeMu.Unlock()
	old, ok := a.table()[vip]
	var groupErr error
	if moved := !ok || !bytes.Equal(old.mac, mac); moved {
		a.change(func(t vipTable) { t[vip] = &choice{mac: mac, rounds: a.opts.Count, cause: cause} })
		a.wake()
		if vip.Is6() {
			groupErr = a.syncGroups() // an IPv4 VIP changes no group
		}
	} else if a.neighOK[vip] {
		return nil // a repeat
	}
	return errors.Join(a.installNeighbour(vip, mac), groupErr)
}

// Remove stops answering for vip and deletes its host neighbour entry. Once it
// returns, no frame about vip is written.
func (a *Announcer) Remove(vip netip.Addr) error {
	vip = vip.Unmap()
	a.changeMu.Lock()
	defer a.changeMu.Unlock()
	var groupErr error
	if _, ok := a.table()[vip]; ok {
		a.change(func(t vipTable) { delete(t, vip) })
		if vip.Is6() {
			groupErr = a.syncGroups()
		}
	}
	delete(a.neighOK, vip)
	if !vip.IsValid() {
		return groupErr
	}
	return errors.Join(a.deleteNeighbour(vip), groupErr)
}

// Adopt makes the owned VIPs exactly want, as answers only: no gratuitous
// ARP and no neighbour-table writes, since want comes from the host's own
// record of what was announced (see Recorded). A VIP whose MAC is unchanged
// keeps its state.
func (a *Announcer) Adopt(want map[netip.Addr]net.HardwareAddr) {
	a.changeMu.Lock()
	defer a.changeMu.Unlock()
	a.change(func(t vipTable) {
		for vip, c := range t {
			if mac, ok := want[vip]; !ok || !bytes.Equal(mac, c.mac) {
				delete(t, vip)
				delete(a.neighOK, vip)
			}
		}
		for vip, mac := range want {
			if _, ok := t[vip]; !ok && validVIP(vip) == nil && len(mac) == 6 {
				t[vip] = &choice{mac: bytes.Clone(mac)}
				a.neighOK[vip] = true
			}
		}
	})
	// Joining again is harmless; a failure shows at the next resync.
	_ = a.syncGroups()
}

// validVIP accepts the unicast addresses a segment can resolve: neither
// IPv6 link-local (a VIP must be reachable from beyond the bridge) nor
// any special-purpose form.
func validVIP(vip netip.Addr) error {
	if !vip.IsValid() || vip.IsUnspecified() || vip.IsLoopback() || vip.IsMulticast() ||
		vip.Is6() && vip.IsLinkLocalUnicast() || vip.Is4In6() || vip.Zone() != "" ||
		vip == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return fmt.Errorf("announce: %s is not a unicast IPv4 or IPv6 address", vip)
	}
	return nil
}
