package announce

import (
	"context"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/metrics"
)

// schedule says which VIPs are due for announcement (gratuitous ARP, or
// unsolicited Neighbor Advertisements), and when. It belongs
// to the announce loop alone, which brings it up to date with the VIP
// table before each use.
type schedule struct {
	seen  *vipTable // the table it was last brought up to date with
	slots map[netip.Addr]*slot
}

// slot is one VIP's place in the schedule.
type slot struct {
	choice *choice   // what is announced; a new choice starts over
	left   int       // gratuitous rounds still to send
	next   time.Time // when the next is due
	// cause is the choice's cause until its failover latency is observed,
	// then zero.
	cause time.Time
}

func newSchedule() *schedule {
	return &schedule{slots: make(map[netip.Addr]*slot)}
}

// follow brings the schedule up to date with t: a new or moved VIP starts
// its choice's rounds, a removed one is dropped, the rest keep their place.
func (s *schedule) follow(t *vipTable) {
	if t == s.seen {
		return
	}
	s.seen = t
	for vip, r := range s.slots {
		if c, ok := (*t)[vip]; !ok || c != r.choice {
			delete(s.slots, vip)
		}
	}
	for vip, c := range *t {
		if _, ok := s.slots[vip]; !ok {
			s.slots[vip] = &slot{choice: c, left: c.rounds, cause: c.cause}
		}
	}
}

// rearm makes every VIP in t due for at least n more rounds, now.
func (s *schedule) rearm(t *vipTable, n int) {
	s.follow(t)
	for _, r := range s.slots {
		if r.left < n {
			r.left = n
			r.next = time.Time{}
		}
	}
}

// sendDue writes the rounds due at now and returns how long until the next
// one, or -1 if none is pending.
func (a *Announcer) sendDue(ctx context.Context, s *schedule, now time.Time) time.Duration {
	if !a.handover.active() {
		return -1 // SetActive(true) wakes the loop
	}
	a.wireMu.RLock()
	defer a.wireMu.RUnlock()
	s.follow(a.vips.Load())
	var next time.Time
	var firstErr error
	failed := 0
	for vip, r := range s.slots {
		if r.left <= 0 {
			continue
		}
		if !r.next.After(now) {
			sent, err := a.sendRound(vip, r.choice.mac)
			if err != nil {
				failed++
				if firstErr == nil {
					firstErr = err
				}
			}
			if !sent.IsZero() && !r.cause.IsZero() {
				metrics.FailoverSeconds.Observe(sent.Sub(r.cause).Seconds())
				r.cause = time.Time{}
			}
			r.left--
			r.next = now.Add(a.opts.Interval)
		}
		if r.left > 0 && (next.IsZero() || r.next.Before(next)) {
			next = r.next
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

// sendRound announces vip at mac once and returns when the first frame was
// written (zero if none was). Callers hold wireMu for reading.
func (a *Announcer) sendRound(vip netip.Addr, mac net.HardwareAddr) (time.Time, error) {
	if vip.Is6() {
		if err := a.advertise(vip, mac); err != nil {
			return time.Time{}, err
		}
		sent := time.Now()
		a.stats.advertisements.Add(1)
		return sent, nil
	}
	return a.sendGratuitousARP(vip, mac)
}

// sendGratuitousARP writes one gratuitous request and one gratuitous reply
// for vip, both from mac, to the broadcast address. Linux moves an
// existing, fresh neighbour entry only when it sees both forms.
func (a *Announcer) sendGratuitousARP(vip netip.Addr, mac net.HardwareAddr) (time.Time, error) {
	conn := a.bridge.Load().ARP
	var (
		first error
		sent  time.Time
	)
	for _, op := range []arp.Operation{arp.OperationRequest, arp.OperationReply} {
		target := zeroMAC
		if op == arp.OperationReply {
			target = ethernet.Broadcast
		}
		if err := conn.WriteTo(arpPacket(op, mac, vip, target, vip), ethernet.Broadcast); err != nil {
			a.stats.writeErrors.Add(1)
			if first == nil {
				first = err
			}
			continue
		}
		if sent.IsZero() {
			sent = time.Now()
		}
		a.stats.gratuitous.Add(1)
	}
	return sent, first
}
