package announce

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/metrics"
)

// zeroMAC is the target hardware address of requests that ask rather than tell.
var zeroMAC = net.HardwareAddr{0, 0, 0, 0, 0, 0}

// arpPacket is an Ethernet/IPv4 ARP packet.
func arpPacket(op arp.Operation, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) *arp.Packet {
	return &arp.Packet{
		HardwareType:       1,
		ProtocolType:       uint16(ethernet.EtherTypeIPv4),
		HardwareAddrLength: 6,
		IPLength:           4,
		Operation:          op,
		SenderHardwareAddr: sha,
		SenderIP:           spa,
		TargetHardwareAddr: tha,
		TargetIP:           tpa,
	}
}

// readLoop reads one kind of frame from the bridge until ctx is done,
// following the bridge to a new incarnation when it is re-created. read
// reads and handles one frame from an incarnation's socket.
func (a *Announcer) readLoop(ctx context.Context, proto string, read func(*incarnation) error) {
	logger := klog.FromContext(ctx).WithValues("protocol", proto)
	var lastLog time.Time
	for {
		b := a.bridge.Load()
		err := read(b)
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if a.bridge.Load() != b {
			continue // the bridge was re-created: read the new socket
		}
		if errors.Is(err, net.ErrClosed) {
			logger.Error(err, "Socket closed; no longer answering")
			return
		}
		var sockErr *net.OpError
		if isTimeout(err) || !errors.As(err, &sockErr) {
			continue // a malformed frame: skip it at once
		}
		// A socket error, such as ENETDOWN while the bridge is down: keep
		// going, a little later.
		if time.Since(lastLog) > 10*time.Second {
			logger.V(2).Info("Reading the bridge", "err", err)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// readARP reads and handles one ARP frame.
func (a *Announcer) readARP(ctx context.Context, b *incarnation) error {
	p, eth, err := b.ARP.Read()
	if err == nil {
		a.handle(ctx, p, eth)
	}
	return err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// handle looks at one ARP packet read from the bridge: it wakes probes waiting
// for the address, defends owned VIPs against other hosts' claims and
// answers requests for owned VIPs.
func (a *Announcer) handle(ctx context.Context, p *arp.Packet, eth *ethernet.Frame) {
	if p == nil || eth == nil || p.HardwareType != 1 || p.ProtocolType != uint16(ethernet.EtherTypeIPv4) ||
		p.HardwareAddrLength != 6 || p.IPLength != 4 ||
		len(p.SenderHardwareAddr) != 6 || !p.SenderIP.Is4() || !p.TargetIP.Is4() {
		return
	}
	if p.SenderHardwareAddr[0]&1 != 0 {
		return // a group address never sends anything
	}
	if p.SenderIP.IsUnspecified() && bytes.Equal(p.SenderHardwareAddr, a.bridge.Load().mac) {
		return // one of our own probes
	}
	if a.sincere(p.SenderHardwareAddr, eth.Source) {
		a.notifyProbes(p)
	}
	if !p.SenderIP.IsUnspecified() {
		a.contest(ctx, p.SenderIP, p.SenderHardwareAddr, false)
	}
	if p.Operation != arp.OperationRequest {
		return
	}
	if a.handover.keep(func() { a.answer(ctx, p, eth) }) {
		return // inactive: SetActive may answer it
	}
	a.answer(ctx, p, eth)
}

// answer replies to a request for an owned VIP, with the chosen MAC. Anything
// else (unowned targets, gratuitous announcements) is left alone.
func (a *Announcer) answer(ctx context.Context, req *arp.Packet, eth *ethernet.Frame) {
	vip := req.TargetIP
	if req.SenderIP == vip {
		return // an announcement, not a question
	}
	a.wireMu.RLock()
	defer a.wireMu.RUnlock()
	c, ok := a.table()[vip]
	if !ok || bytes.Equal(req.SenderHardwareAddr, c.mac) {
		return
	}
	dst := req.SenderHardwareAddr
	if len(eth.Source) == 6 && eth.Source[0]&1 == 0 {
		dst = eth.Source
	}
	reply := arpPacket(arp.OperationReply, c.mac, vip, req.SenderHardwareAddr, req.SenderIP)
	if err := a.bridge.Load().ARP.WriteTo(reply, dst); err != nil {
		a.stats.writeErrors.Add(1)
		klog.FromContext(ctx).V(2).Info("Answering ARP", "vip", vip, "to", dst, "err", err)
		return
	}
	a.stats.replies.Add(1)
	metrics.ARPReplies.Inc()
}
