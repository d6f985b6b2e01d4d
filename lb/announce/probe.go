package announce

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
)

// prober is one Probe waiting for news of its address.
type prober struct {
	want  net.HardwareAddr      // the one host it waits for; nil: any other
	owner chan net.HardwareAddr // capacity 1; the first claim wins
}

// probers are the Probes waiting, by address.
type probers struct {
	mu    sync.Mutex
	byVIP map[netip.Addr]map[*prober]struct{}
}

// add registers a Probe of vip, waiting for want (nil: anyone), until
// done is called.
func (ps *probers) add(vip netip.Addr, want net.HardwareAddr) (w *prober, done func()) {
	w = &prober{want: want, owner: make(chan net.HardwareAddr, 1)}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	set := ps.byVIP[vip]
	if set == nil {
		set = make(map[*prober]struct{})
		ps.byVIP[vip] = set
	}
	set[w] = struct{}{}
	return w, func() {
		ps.mu.Lock()
		defer ps.mu.Unlock()
		delete(set, w)
		if len(set) == 0 {
			delete(ps.byVIP, vip)
		}
	}
}

func (ps *probers) waiting(vip netip.Addr) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return len(ps.byVIP[vip]) > 0
}

// tell gives owner to every Probe of vip that has not heard yet and
// waits for it, or for anyone.
func (ps *probers) tell(vip netip.Addr, owner net.HardwareAddr) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for w := range ps.byVIP[vip] {
		if w.want != nil && !bytes.Equal(w.want, owner) {
			continue
		}
		select {
		case w.owner <- owner:
		default:
		}
	}
}

// Probe asks the bridge whether anyone else uses vip, before it is claimed: it
// sends an ARP probe (sender IP 0.0.0.0, RFC 5227) or, for IPv6, a
// duplicate-address probe (RFC 4862), and waits up to the probe timeout for
// another host to answer for vip, or to announce or probe it. An answer
// carrying the MAC this Announcer itself uses for vip is not a conflict,
// nor is a frame whose Ethernet source is not the MAC it names: that is
// no host's answer but a forgery. Probes run concurrently; each waits on
// its own. Run must be running.
//
// The host's own addresses are not detected: its stack never sees the probe it
// sends itself. Pools must leave them out.
func (a *Announcer) Probe(ctx context.Context, vip netip.Addr) (owner net.HardwareAddr, taken bool, err error) {
	return a.probe(ctx, vip, nil)
}

// ProbeFor probes ip as Probe does, but waits for the host at want only:
// whether a node's guest answers on the bridge. Another host's answer
// neither counts nor ends the wait, nor does a frame from another
// Ethernet source that names want. A host that also sends from want is
// not told apart: it gains nothing new by it, since the bridge, learning
// want on its port, already sends it the guest's traffic.
func (a *Announcer) ProbeFor(ctx context.Context, ip netip.Addr, want net.HardwareAddr) (answered bool, err error) {
	if len(want) != 6 || want[0]&1 != 0 {
		return false, fmt.Errorf("probing %s: %q is no host's MAC", ip, want)
	}
	_, answered, err = a.probe(ctx, ip, want)
	return answered, err
}

// probe is Probe waiting for want (nil: any other host).
func (a *Announcer) probe(ctx context.Context, vip netip.Addr, want net.HardwareAddr) (owner net.HardwareAddr, taken bool, err error) {
	vip = vip.Unmap()
	if err := validVIP(vip); err != nil {
		return nil, false, err
	}
	timeout := time.NewTimer(a.opts.ProbeTimeout)
	defer timeout.Stop()
	select {
	case <-a.started:
	default:
		// Wait a little for Run. Checked first: a caller descheduled past
		// the timeout must not see a running Announcer as not running.
		select {
		case <-a.started:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		case <-timeout.C:
			return nil, false, fmt.Errorf("probing %s: %w", vip, ErrNotRunning)
		}
	}

	w, done := a.probes.add(vip, want)
	defer done()

	// Two probes, the second halfway through, in case the first is lost.
	if err := a.sendProbe(vip); err != nil {
		return nil, false, fmt.Errorf("probing %s: %w", vip, err)
	}
	timeout.Reset(a.opts.ProbeTimeout)
	again := time.NewTimer(a.opts.ProbeTimeout / 2)
	defer again.Stop()
	for {
		select {
		case mac := <-w.owner:
			return mac, true, nil
		case <-again.C:
			if err := a.sendProbe(vip); err != nil {
				return nil, false, fmt.Errorf("probing %s: %w", vip, err)
			}
		case <-timeout.C:
			select {
			case mac := <-w.owner:
				return mac, true, nil // a claim read just as time ran out
			default:
			}
			return nil, false, nil
		case <-a.readerDone:
			return nil, false, fmt.Errorf("probing %s: %w", vip, ErrNotRunning)
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

func (a *Announcer) sendProbe(vip netip.Addr) error {
	if vip.Is6() {
		if err := a.sendNDProbe(vip); err != nil {
			return err
		}
		a.stats.probes.Add(1)
		return nil
	}
	b := a.bridge.Load()
	p := arpPacket(arp.OperationRequest, b.mac, netip.IPv4Unspecified(), zeroMAC, vip)
	if err := b.ARP.WriteTo(p, ethernet.Broadcast); err != nil {
		a.stats.writeErrors.Add(1)
		return err
	}
	a.stats.probes.Add(1)
	return nil
}

// sincere says whether a frame came from the MAC its payload names, and
// counts it if not. A forged frame is no host's answer to a probe; a
// claim on an owned VIP is defended against all the same, because
// stations learn the MAC the payload names (Linux's arp_process and
// ndisc_recv_na take it), not the Ethernet source.
func (a *Announcer) sincere(named, ethSrc net.HardwareAddr) bool {
	if bytes.Equal(named, ethSrc) {
		return true
	}
	a.stats.forged.Add(1)
	return false
}

// notifyProbes tells the probes of an address that someone else claims it: by
// sending with it as the sender IP (an answer or an announcement), or by
// probing it too. The caller has checked that the packet came from the
// MAC it names.
func (a *Announcer) notifyProbes(p *arp.Packet) {
	claimed := p.SenderIP
	if claimed.IsUnspecified() {
		if p.Operation != arp.OperationRequest {
			return
		}
		claimed = p.TargetIP // a simultaneous probe from another host
	}
	a.claimed(claimed, p.SenderHardwareAddr)
}

// claimed tells the probes of ip that the host with MAC from uses it,
// unless from is the bridge or this Announcer's own choice for ip.
func (a *Announcer) claimed(ip netip.Addr, from net.HardwareAddr) {
	if !a.probes.waiting(ip) {
		return
	}
	if bytes.Equal(from, a.bridge.Load().mac) {
		return // the bridge itself
	}
	if c, ok := a.table()[ip]; ok && bytes.Equal(c.mac, from) {
		return // our own choice answering
	}
	a.probes.tell(ip, bytes.Clone(from))
}
