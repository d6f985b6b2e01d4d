package announce

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/metrics"
)

// zeroMAC is the target hardware address of requests that ask rather than tell.
var zeroMAC = net.HardwareAddr{0, 0, 0, 0, 0, 0}

// Run answers ARP requests for owned VIPs and sends the gratuitous ARP that
// Set, start-up, the bridge coming back up and the refresh timer call for,
// until ctx is done. Everything it starts has stopped when it returns. It may
// be called once.
func (a *Announcer) Run(ctx context.Context) error {
	if !a.ran.CompareAndSwap(false, true) {
		return errors.New("announce: Run called twice")
	}
	logger := klog.FromContext(ctx).WithValues("bridge", a.name)
	ctx = klog.NewContext(ctx, logger)

	var linkUp <-chan int
	if a.opts.Links != nil {
		ch, err := a.opts.Links.WatchUp(ctx, a.name)
		if err != nil {
			close(a.readerDone)
			return err
		}
		linkUp = ch
	}

	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		defer close(a.readerDone)
		a.readLoop(ctx)
	}()
	go func() {
		// Unblock the reader once ctx is done, on whichever connection it
		// reads by then.
		defer wg.Done()
		<-ctx.Done()
		for {
			_, _, conn := a.link()
			if err := conn.SetReadDeadline(time.Now()); err != nil {
				logger.V(2).Info("Could not interrupt the ARP reader", "err", err)
			}
			select {
			case <-a.readerDone:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	go func() {
		defer wg.Done()
		a.announceLoop(ctx, linkUp)
	}()
	close(a.started)
	logger.V(2).Info("Announcing VIPs")
	wg.Wait()
	if linkUp != nil {
		for range linkUp {
			// The watcher closes it once it has stopped.
		}
	}
	return nil
}

func (a *Announcer) readLoop(ctx context.Context) {
	logger := klog.FromContext(ctx)
	var lastLog time.Time
	for {
		_, _, conn := a.link()
		p, eth, err := conn.Read()
		if err == nil {
			a.handle(ctx, p, eth)
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if _, _, now := a.link(); now != conn {
			continue // the bridge was re-created: read the new socket
		}
		if errors.Is(err, net.ErrClosed) {
			logger.Error(err, "ARP socket closed; no longer answering")
			return
		}
		var sockErr *net.OpError
		if isTimeout(err) || !errors.As(err, &sockErr) {
			continue // a malformed frame: skip it at once
		}
		// A socket error, such as ENETDOWN while the bridge is down: keep
		// going, a little later.
		if time.Since(lastLog) > 10*time.Second {
			logger.V(2).Info("Reading ARP", "err", err)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// handle looks at one ARP packet read from the bridge: it wakes probes waiting
// for the address and answers requests for owned VIPs.
func (a *Announcer) handle(ctx context.Context, p *arp.Packet, eth *ethernet.Frame) {
	if p == nil || p.HardwareType != 1 || p.ProtocolType != uint16(ethernet.EtherTypeIPv4) ||
		p.HardwareAddrLength != 6 || p.IPLength != 4 ||
		len(p.SenderHardwareAddr) != 6 || !p.SenderIP.Is4() || !p.TargetIP.Is4() {
		return
	}
	if p.SenderHardwareAddr[0]&1 != 0 {
		return // a group address never sends anything
	}
	if _, mac, _ := a.link(); p.SenderIP.IsUnspecified() && bytes.Equal(p.SenderHardwareAddr, mac) {
		return // one of our own probes
	}
	a.notifyProbes(p)
	if p.Operation != arp.OperationRequest {
		return
	}
	a.heldMu.Lock()
	if !a.active.Load() {
		a.holdRequest(p, eth)
		a.heldMu.Unlock()
		return
	}
	a.heldMu.Unlock()
	a.answer(ctx, p, eth)
}

// holdRequest keeps a request read while inactive, for SetActive to
// answer if this process takes over soon after. Callers hold heldMu.
func (a *Announcer) holdRequest(p *arp.Packet, eth *ethernet.Frame) {
	now := time.Now()
	n := 0
	for _, h := range a.held {
		if now.Sub(h.at) < heldFor {
			a.held[n] = h
			n++
		}
	}
	a.held = a.held[:n]
	if len(a.held) >= maxHeld {
		a.held = a.held[1:]
	}
	a.held = append(a.held, heldRequest{p: p, eth: eth, at: now})
}

// answer replies to a request for an owned VIP, with the chosen MAC. Anything
// else (unowned targets, gratuitous announcements) is left alone.
func (a *Announcer) answer(ctx context.Context, req *arp.Packet, eth *ethernet.Frame) {
	vip := req.TargetIP
	if req.SenderIP == vip {
		return // an announcement, not a question
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	e, ok := a.vips[vip]
	if !ok || bytes.Equal(req.SenderHardwareAddr, e.mac) {
		return
	}
	dst := req.SenderHardwareAddr
	if eth != nil && len(eth.Source) == 6 && eth.Source[0]&1 == 0 {
		dst = eth.Source
	}
	reply := &arp.Packet{
		HardwareType:       1,
		ProtocolType:       uint16(ethernet.EtherTypeIPv4),
		HardwareAddrLength: 6,
		IPLength:           4,
		Operation:          arp.OperationReply,
		SenderHardwareAddr: e.mac,
		SenderIP:           vip,
		TargetHardwareAddr: req.SenderHardwareAddr,
		TargetIP:           req.SenderIP,
	}
	_, _, conn := a.link()
	if err := conn.WriteTo(reply, dst); err != nil {
		a.writeErrors.Add(1)
		klog.FromContext(ctx).V(2).Info("Answering ARP", "vip", vip, "to", dst, "err", err)
		return
	}
	a.replies.Add(1)
	metrics.ARPReplies.Inc()
}

// announceLoop sends gratuitous ARP rounds as they fall due, re-arms every VIP
// when the link comes back up, and refreshes slowly.
func (a *Announcer) announceLoop(ctx context.Context, linkUp <-chan int) {
	logger := klog.FromContext(ctx)
	var retry <-chan time.Time // rebinding to a re-created bridge failed
	var refresh <-chan time.Time
	if a.opts.Refresh > 0 {
		t := time.NewTicker(a.opts.Refresh)
		defer t.Stop()
		refresh = t.C
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wait := a.sendDue(ctx, time.Now())
		var due <-chan time.Time
		if wait >= 0 {
			timer.Reset(wait)
			due = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-a.kick:
		case <-due:
		case <-refresh:
			a.rearm(1)
			a.resyncNeighbours(ctx)
		case index, ok := <-linkUp:
			if !ok {
				linkUp = nil
				continue
			}
			retry = nil
			if err := a.rebind(ctx, index); err != nil {
				logger.Error(err, "Bridge re-created; cannot bind to it yet, retrying")
				retry = time.After(200 * time.Millisecond)
				continue
			}
			logger.Info("Bridge is up again; re-announcing every VIP", "index", index)
			a.resyncNeighbours(ctx)
			a.rearm(a.opts.Count)
		case <-retry:
			retry = nil
			if err := a.rebind(ctx, -1); err != nil {
				retry = time.After(200 * time.Millisecond)
				continue
			}
			logger.Info("Bound to the re-created bridge; re-announcing every VIP")
			a.resyncNeighbours(ctx)
			a.rearm(a.opts.Count)
		}
		timer.Stop()
	}
}

func (a *Announcer) resyncNeighbours(ctx context.Context) {
	if failed, err := a.syncNeighbours(); err != nil {
		klog.FromContext(ctx).Error(err, "Re-installing host neighbour entries", "failed", failed)
	}
}

// rearm makes every VIP due for at least rounds more rounds, now.
func (a *Announcer) rearm(rounds int) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	for _, e := range a.vips {
		if e.left < rounds {
			e.left = rounds
			e.next = time.Time{}
		}
	}
}

// sendDue writes the rounds due at now and returns how long until the next
// one, or -1 if none is pending.
func (a *Announcer) sendDue(ctx context.Context, now time.Time) time.Duration {
	if !a.active.Load() {
		return -1 // SetActive(true) wakes the loop
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	var next time.Time
	var firstErr error
	failed := 0
	for vip, e := range a.vips {
		if e.left <= 0 {
			continue
		}
		if !e.next.After(now) {
			sent, err := a.sendRound(vip, e.mac)
			if err != nil {
				failed++
				if firstErr == nil {
					firstErr = err
				}
			}
			if !sent.IsZero() && !e.cause.IsZero() {
				metrics.FailoverSeconds.Observe(sent.Sub(e.cause).Seconds())
				e.cause = time.Time{}
			}
			e.left--
			e.next = now.Add(a.opts.Interval)
		}
		if e.left > 0 && (next.IsZero() || e.next.Before(next)) {
			next = e.next
		}
	}
	if firstErr != nil {
		klog.FromContext(ctx).Error(firstErr, "Sending gratuitous ARP", "failedVIPs", failed)
	}
	if next.IsZero() {
		return -1
	}
	return max(next.Sub(now), 0)
}

// sendRound writes one gratuitous request and one gratuitous reply for vip,
// both from mac, to the broadcast address, and returns when the first frame
// was written (zero if none was). Linux moves an existing, fresh neighbour
// entry only when it sees both forms.
func (a *Announcer) sendRound(vip netip.Addr, mac net.HardwareAddr) (time.Time, error) {
	_, _, conn := a.link()
	var (
		first error
		sent  time.Time
	)
	for _, op := range []arp.Operation{arp.OperationRequest, arp.OperationReply} {
		target := zeroMAC
		if op == arp.OperationReply {
			target = ethernet.Broadcast
		}
		p := &arp.Packet{
			HardwareType:       1,
			ProtocolType:       uint16(ethernet.EtherTypeIPv4),
			HardwareAddrLength: 6,
			IPLength:           4,
			Operation:          op,
			SenderHardwareAddr: mac,
			SenderIP:           vip,
			TargetHardwareAddr: target,
			TargetIP:           vip,
		}
		if err := conn.WriteTo(p, ethernet.Broadcast); err != nil {
			a.writeErrors.Add(1)
			if first == nil {
				first = err
			}
			continue
		}
		if sent.IsZero() {
			sent = time.Now()
		}
		a.gratuitous.Add(1)
	}
	return sent, first
}

// rebind moves to the bridge's incarnation with this index (-1: look it
// up), when the bridge was deleted and created again under its name: a new
// socket, and the neighbour entries and announcements follow on the new
// index. The same index (the bridge only went down and up) keeps everything.
func (a *Announcer) rebind(ctx context.Context, index int) error {
	cur, _, _ := a.link()
	if cur == index || a.opts.Reopen == nil {
		return nil
	}
	ifi, conn, err := a.opts.Reopen(a.name)
	if err != nil {
		return err
	}
	if ifi.Index == cur {
		return conn.Close()
	}
	a.linkMu.Lock()
	old := a.conn
	a.index, a.mac, a.conn = ifi.Index, bytes.Clone(ifi.HardwareAddr), conn
	a.linkMu.Unlock()
	if ctx.Err() != nil {
		_ = conn.SetReadDeadline(time.Now())
	}
	_ = old.Close() // the reader moves to the new socket
	a.opMu.Lock()
	clear(a.neighOK)
	a.opMu.Unlock()
	return nil
}
