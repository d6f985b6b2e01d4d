package announce

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
)

// prober is one Probe waiting for news of its address.
type prober struct {
	owner chan net.HardwareAddr // capacity 1; the first claim wins
}

// Probe asks the bridge whether anyone else uses vip, before it is claimed: it
// sends an ARP probe (sender IP 0.0.0.0, RFC 5227) and waits up to the probe
// timeout for another host to answer for vip, or to announce or probe it. An
// answer carrying the MAC this Announcer itself uses for vip is not a conflict.
// Probes run concurrently; each waits on its own. Run must be running.
//
// The host's own addresses are not detected: its stack never sees the probe it
// sends itself. Pools must leave them out.
func (a *Announcer) Probe(ctx context.Context, vip netip.Addr) (owner net.HardwareAddr, taken bool, err error) {
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

	w := &prober{owner: make(chan net.HardwareAddr, 1)}
	a.probeMu.Lock()
	set := a.probes[vip]
	if set == nil {
		set = make(map[*prober]struct{})
		a.probes[vip] = set
	}
	set[w] = struct{}{}
	a.probeMu.Unlock()
	defer func() {
		a.probeMu.Lock()
		delete(set, w)
		if len(set) == 0 {
			delete(a.probes, vip)
		}
		a.probeMu.Unlock()
	}()

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
	_, mac, conn := a.link()
	p := &arp.Packet{
		HardwareType:       1,
		ProtocolType:       uint16(ethernet.EtherTypeIPv4),
		HardwareAddrLength: 6,
		IPLength:           4,
		Operation:          arp.OperationRequest,
		SenderHardwareAddr: mac,
		SenderIP:           netip.IPv4Unspecified(),
		TargetHardwareAddr: zeroMAC,
		TargetIP:           vip,
	}
	if err := conn.WriteTo(p, ethernet.Broadcast); err != nil {
		a.writeErrors.Add(1)
		return err
	}
	a.probesSent.Add(1)
	return nil
}

// notifyProbes tells the probes of an address that someone else claims it: by
// sending with it as the sender IP (an answer or an announcement), or by
// probing it too.
func (a *Announcer) notifyProbes(p *arp.Packet) {
	claimed := p.SenderIP
	if claimed.IsUnspecified() {
		if p.Operation != arp.OperationRequest {
			return
		}
		claimed = p.TargetIP // a simultaneous probe from another host
	}
	a.probeMu.Lock()
	waiting := len(a.probes[claimed])
	a.probeMu.Unlock()
	if waiting == 0 {
		return
	}
	if _, mac, _ := a.link(); bytes.Equal(p.SenderHardwareAddr, mac) {
		return // the bridge itself
	}
	if mac, ok := a.Owned(claimed); ok && bytes.Equal(mac, p.SenderHardwareAddr) {
		return // our own choice answering
	}
	owner := bytes.Clone(p.SenderHardwareAddr)
	a.probeMu.Lock()
	defer a.probeMu.Unlock()
	for w := range a.probes[claimed] {
		select {
		case w.owner <- owner:
		default:
		}
	}
}
