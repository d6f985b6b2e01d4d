package announce

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/metrics"
)

// Another host claims an owned VIP when it sends an ARP packet with the
// VIP as sender IP, a Neighbor Advertisement for it or a solicitation from
// it, each at a MAC not ours, or probes for it (IPv6 duplicate-address
// detection). One such frame would take the VIP from every station that
// reads it until the next refresh. The VIP is defended as RFC 5227 §2.4 (c)
// lets a host that must keep its address: at once, with the round the
// announce loop sends for it anyway (a gratuitous ARP request and reply,
// or an unsolicited advertisement to all nodes, which also fails the
// prober's detection, RFC 4862 §5.4.3), and at most once per
// DefendInterval, however many claims arrive. The claims in between are
// counted, and the next report says how many. Two hosts that both keep a
// VIP thus trade a round each per interval instead of flooding, and a
// spoofed flood costs one frame or two, one log line and one report per
// interval.

// DefendInterval is the least time between two defences of one VIP (RFC
// 5227's DEFEND_INTERVAL).
const DefendInterval = 10 * time.Second

// A Defence is another host's claim on an owned VIP, answered in the
// VIP's defence.
type Defence struct {
	VIP  netip.Addr
	From net.HardwareAddr
	// Probe: the claim was an IPv6 duplicate-address probe, so the host
	// has not taken the VIP yet; else it announced or used it.
	Probe bool
	// Ignored is how many claims on the VIP went unanswered since its
	// previous defence, less than DefendInterval before each.
	Ignored uint64
}

// guard is one VIP's defence record. It lives in the VIP's choice: there
// is one only while the VIP is owned, and it goes with it.
type guard struct {
	mu      sync.Mutex
	last    time.Time // of the last defence; zero before the first
	ignored uint64    // claims ignored since
}

// due says whether a claim at now is answered; if not, it is counted. An
// answered claim takes the count of those ignored before it.
func (g *guard) due(now time.Time) (ignored uint64, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.last.IsZero() && now.Sub(g.last) < DefendInterval {
		g.ignored++
		return 0, false
	}
	ignored = g.ignored
	g.last, g.ignored = now, 0
	return ignored, true
}

// contest defends vip if it is owned and the host with MAC from, not
// ours, claims it; probe says the claim was a duplicate-address probe.
func (a *Announcer) contest(ctx context.Context, vip netip.Addr, from net.HardwareAddr, probe bool) {
	if !a.handover.active() {
		return // the answering process defends
	}
	a.wireMu.RLock()
	c, owned := a.table()[vip]
	if !owned || a.ours(from) {
		a.wireMu.RUnlock()
		return
	}
	ignored, due := c.guard.due(time.Now())
	if !due {
		a.wireMu.RUnlock()
		a.stats.ignored.Add(1)
		metrics.VIPClaimsIgnored.Inc()
		return
	}
	_, err := a.sendRound(vip, c.mac)
	a.wireMu.RUnlock()
	a.stats.defended.Add(1)
	metrics.VIPsDefended.Inc()
	klog.FromContext(ctx).Info("Another host claims an owned VIP; defending it",
		"vip", vip, "from", from, "probe", probe, "ignoredSinceLastDefence", ignored, "err", err)
	if a.opts.OnDefend != nil {
		a.opts.OnDefend(Defence{VIP: vip, From: bytes.Clone(from), Probe: probe, Ignored: ignored})
	}
}

// ours says whether mac is the bridge's or a node's that answers some
// owned VIP. Frames from those are the host's own (another process on the
// bridge, or a round written just before a move) or one of the nodes
// placement chooses from, not a stranger's. The caller holds wireMu.
func (a *Announcer) ours(mac net.HardwareAddr) bool {
	return bytes.Equal(mac, a.bridge.Load().mac) || a.answerMACs[string(mac)]
}
