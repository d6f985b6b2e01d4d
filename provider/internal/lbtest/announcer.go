// Package lbtest holds what provider's and placement's tests share: an
// announcer and a hypervisor the tests drive, two Nodes whose domains run
// with a NIC on the bridge, the Services and EndpointSlices they serve,
// and the recorded events. Only tests import it.
package lbtest

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
)

// Announcer records what is asked of the bridge. Probe reports a foreign
// owner for the addresses SetForeign gave one; ProbeFor, whether that
// owner is the MAC asked for.
type Announcer struct {
	mu      sync.Mutex
	owned   map[netip.Addr]net.HardwareAddr
	foreign map[netip.Addr]net.HardwareAddr
	sets    []string // "ip mac", in order
	removes []netip.Addr
	probes  []netip.Addr
	causes  []time.Time // non-zero causes given to SetAfter
	// hold, if set, keeps each Answering call waiting until it is closed;
	// held counts the calls that waited.
	hold chan struct{}
	held int
}

// NewAnnouncer returns an announcer that answers nothing yet.
func NewAnnouncer() *Announcer {
	return &Announcer{owned: map[netip.Addr]net.HardwareAddr{}, foreign: map[netip.Addr]net.HardwareAddr{}}
}

func (a *Announcer) SetAfter(vip netip.Addr, mac net.HardwareAddr, cause time.Time) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.owned[vip] = mac
	a.sets = append(a.sets, vip.String()+" "+mac.String())
	if !cause.IsZero() {
		a.causes = append(a.causes, cause)
	}
	return nil
}

func (a *Announcer) Remove(vip netip.Addr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.owned, vip)
	a.removes = append(a.removes, vip)
	return nil
}

func (a *Announcer) Probe(_ context.Context, vip netip.Addr) (net.HardwareAddr, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.probes = append(a.probes, vip)
	if mac, ok := a.foreign[vip]; ok {
		return mac, true, nil
	}
	return nil, false, nil
}

func (a *Announcer) ProbeFor(_ context.Context, ip netip.Addr, mac net.HardwareAddr) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.probes = append(a.probes, ip)
	return bytes.Equal(a.foreign[ip], mac), nil
}

func (a *Announcer) Answering() map[netip.Addr]net.HardwareAddr {
	a.mu.Lock()
	if hold := a.hold; hold != nil {
		a.held++
		a.mu.Unlock()
		<-hold
		a.mu.Lock()
	}
	defer a.mu.Unlock()
	out := map[netip.Addr]net.HardwareAddr{}
	for ip, mac := range a.owned {
		out[ip] = mac
	}
	return out
}

func (a *Announcer) Owned(vip netip.Addr) (net.HardwareAddr, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	mac, ok := a.owned[vip]
	return mac, ok
}

func (a *Announcer) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// SetForeign makes mac another host's answer for vip; nil: none.
func (a *Announcer) SetForeign(vip netip.Addr, mac net.HardwareAddr) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if mac == nil {
		delete(a.foreign, vip)
		return
	}
	a.foreign[vip] = mac
}

// MAC is the MAC that answers for vip now, nil if none.
func (a *Announcer) MAC(vip netip.Addr) net.HardwareAddr {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.owned[vip]
}

// Sets is every SetAfter so far, as "ip mac", in order.
func (a *Announcer) Sets() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.sets)
}

// SetsFor is the SetAfter calls for vip so far.
func (a *Announcer) SetsFor(vip netip.Addr) []string {
	var out []string
	for _, s := range a.Sets() {
		if strings.HasPrefix(s, vip.String()+" ") {
			out = append(out, s)
		}
	}
	return out
}

// Removed says whether vip was ever removed.
func (a *Announcer) Removed(vip netip.Addr) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Contains(a.removes, vip)
}

// Probes is the addresses probed so far (Probe and ProbeFor), in order.
func (a *Announcer) Probes() []netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.probes)
}

// Causes is the non-zero causes given to SetAfter so far.
func (a *Announcer) Causes() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.causes)
}

// Hold keeps each Answering call from now on waiting until hold is closed.
func (a *Announcer) Hold(hold chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hold = hold
}

// Held is how many Answering calls waited for the hold.
func (a *Announcer) Held() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held
}
