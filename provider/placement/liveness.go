package placement

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// A hypervisor that cannot be asked may be a lost connection (its guests
// run on) or a lost host (they went with it); only the LAN can tell. While
// a Node's hypervisor cannot be asked, placement has its guest's address
// probed on the bridge every livenessRound; after lostAfterMisses rounds
// in a row without an answer from the guest's MAC, the node is lost: its
// VIPs move to nodes that can answer them. One answer makes it found again.
// Only the guest's own answer counts (Announcer.ProbeFor): a host naming
// the guest's MAC from its own keeps no dead guest alive, and one that
// answers first makes no live guest lost.
//
// A lost guest that stays silent (its host is gone) is probed ever less
// often: after each further silent probe the wait doubles, from two rounds
// up to livenessMaxWait. A guest that answers is probed every round, so
// that the first detection of a death stays as fast; an answer, or
// watching the guest anew, brings that back.
const (
	livenessRound   = 100 * time.Millisecond
	lostAfterMisses = 2
	livenessMaxWait = 5 * time.Second
)

// prober asks the bridge whether the host at mac answers for ip
// (Announcer.ProbeFor): another host's answer, or a frame naming mac from
// another host, is none.
type prober func(ctx context.Context, ip netip.Addr, mac net.HardwareAddr) (answered bool, err error)

// liveness probes the guests placement watches. Placement owns the set
// (watch, every pass); the probe loop owns the verdicts.
type liveness struct {
	probe   prober
	changed func()        // a verdict changed: placement must pass again
	wake    chan struct{} // capacity 1: a guest is watched; the loop was idle

	mu      sync.Mutex
	watched map[netip.Addr]*guestLiveness
}

// guestLiveness is what probing has found of one guest.
type guestLiveness struct {
	mac    net.HardwareAddr // the answer that counts: the guest's own
	misses int              // probes in a row without it
	wait   time.Duration    // between probes once lost; 0: every round
	next   time.Time        // no probe before
}

func newLiveness(probe prober, changed func()) *liveness {
	return &liveness{probe: probe, changed: changed, wake: make(chan struct{}, 1), watched: map[netip.Addr]*guestLiveness{}}
}

// watch makes targets (address → the guest's MAC) the guests probed from
// now on; a guest already watched with the same MAC keeps its misses.
func (l *liveness) watch(targets map[netip.Addr]net.HardwareAddr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ip, g := range l.watched {
		if mac, ok := targets[ip]; !ok || !bytes.Equal(mac, g.mac) {
			delete(l.watched, ip)
		}
	}
	for ip, mac := range targets {
		if _, ok := l.watched[ip]; !ok {
			l.watched[ip] = &guestLiveness{mac: mac}
		}
	}
	if len(l.watched) > 0 {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// watching says whether some guest is watched.
func (l *liveness) watching() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.watched) > 0
}

// lost says whether the guest at ip is watched and has missed
// lostAfterMisses rounds in a row.
func (l *liveness) lost(ip netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	g, ok := l.watched[ip]
	return ok && g.misses >= lostAfterMisses
}

// run probes every watched guest each round until ctx ends; with none
// watched (every hypervisor answers) it sleeps until one is.
func (l *liveness) run(ctx context.Context) {
	for {
		if !l.watching() {
			select {
			case <-ctx.Done():
				return
			case <-l.wake:
			}
			continue
		}
		t := time.NewTicker(livenessRound)
		for l.watching() {
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			l.round(ctx, time.Now())
		}
		t.Stop()
	}
}

// round probes every watched guest due at now at once and records the
// answers.
func (l *liveness) round(ctx context.Context, now time.Time) {
	l.mu.Lock()
	targets := make(map[netip.Addr]net.HardwareAddr, len(l.watched))
	for ip, g := range l.watched {
		if !now.Before(g.next) {
			targets[ip] = g.mac
		}
	}
	l.mu.Unlock()
	if len(targets) == 0 {
		return
	}
	answered := make(map[netip.Addr]bool, len(targets))
	var (
		wg  sync.WaitGroup
		amu sync.Mutex
	)
	for ip, mac := range targets {
		wg.Go(func() {
			ok, err := l.probe(ctx, ip, mac)
			if err != nil {
				klog.FromContext(ctx).V(4).Info("Cannot probe a guest whose hypervisor cannot be asked", "address", ip, "err", err)
				return // no verdict: the probe, not the guest, failed
			}
			amu.Lock()
			answered[ip] = ok
			amu.Unlock()
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	if l.record(answered, now) {
		l.changed()
	}
}

// record counts the answers of a round begun at now (probed address →
// answered by the guest's MAC), backs off the lost guests still silent,
// and says whether any guest was lost or found by it.
func (l *liveness) record(answered map[netip.Addr]bool, now time.Time) (changed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ip, ok := range answered {
		g, watched := l.watched[ip]
		if !watched {
			continue
		}
		was := g.misses >= lostAfterMisses
		if ok {
			g.misses, g.wait, g.next = 0, 0, time.Time{}
		} else {
			g.misses++
		}
		if g.misses >= lostAfterMisses {
			g.wait = min(max(2*g.wait, 2*livenessRound), livenessMaxWait)
			g.next = now.Add(g.wait)
		}
		changed = changed || was != (g.misses >= lostAfterMisses)
	}
	return changed
}

// probeAddress is the address a Node's guest is probed at: its first
// InternalIP of IPv4 (ARP), else its first InternalIP.
func probeAddress(n *v1.Node) (netip.Addr, bool) {
	var first netip.Addr
	for _, a := range n.Status.Addresses {
		ip, err := netip.ParseAddr(a.Address)
		if a.Type != v1.NodeInternalIP || err != nil {
			continue
		}
		if ip = ip.Unmap(); ip.Is4() {
			return ip, true
		}
		if !first.IsValid() {
			first = ip
		}
	}
	return first, first.IsValid()
}
