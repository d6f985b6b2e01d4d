package announce

import "sync/atomic"

// Stats counts what an Announcer has written to the bridge.
type Stats struct {
	// Gratuitous is the number of gratuitous ARP frames written; a round is
	// two frames (request form and reply form). A defence is a round too.
	Gratuitous uint64
	// Replies is the number of answers to ARP requests for owned VIPs.
	Replies uint64
	// Advertisements is the number of unsolicited Neighbor Advertisements
	// written: one per round for an IPv6 VIP, defences included.
	Advertisements uint64
	// NDReplies is the number of answers to Neighbor Solicitations for
	// owned VIPs.
	NDReplies uint64
	// Defended is the number of other hosts' claims on owned VIPs answered
	// in the VIP's defence: at most one per DefendInterval per VIP.
	Defended uint64
	// Ignored is the number of other hosts' claims on owned VIPs left
	// unanswered because the VIP was defended less than DefendInterval
	// before.
	Ignored uint64
	// Probes is the number of ARP or duplicate-address probes written by
	// Probe.
	Probes uint64
	// WriteErrors is the number of frames that could not be written.
	WriteErrors uint64
	// Forged is the number of ARP packets and Neighbor Advertisements
	// read whose Ethernet source is not the MAC they name (the sender
	// hardware address, the target link-layer address): no probe takes
	// them for an answer.
	Forged uint64
}

// counters are the Stats as they grow, bumped by whichever goroutine
// wrote the frame.
type counters struct {
	gratuitous, replies, advertisements, ndReplies, defended, ignored, probes, writeErrors, forged atomic.Uint64
}

// Stats returns the counters so far.
func (a *Announcer) Stats() Stats {
	return Stats{
		Gratuitous:     a.stats.gratuitous.Load(),
		Replies:        a.stats.replies.Load(),
		Advertisements: a.stats.advertisements.Load(),
		NDReplies:      a.stats.ndReplies.Load(),
		Defended:       a.stats.defended.Load(),
		Ignored:        a.stats.ignored.Load(),
		Probes:         a.stats.probes.Load(),
		WriteErrors:    a.stats.writeErrors.Load(),
		Forged:         a.stats.forged.Load(),
	}
}
