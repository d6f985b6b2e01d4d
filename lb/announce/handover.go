package announce

import (
	"sync"
	"time"
)

// Requests read while inactive are kept this long (and at most maxBacklog
// of them) for SetActive to answer: a client's request that reached the
// bridge while no process answered (a leader's process dying, names being
// handed over) still gets its answer, well within the client's wait for it
// (Linux retransmits after 1 s).
const (
	backlogFor = time.Second
	maxBacklog = 256
)

// handover is whether this Announcer answers and announces on the bridge
// (only the host's one announcer may; see Role), and the requests read
// while it did not. One mutex, so that a request is either answered or
// kept for the hand-over, never dropped between the two.
type handover struct {
	mu      sync.Mutex
	on      bool
	backlog []request
}

// request is a question read while inactive: an ARP request or a Neighbor
// Solicitation, and how to answer it.
type request struct {
	answer func()
	at     time.Time
}

func (h *handover) active() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.on
}

// keep keeps the request's answer if inactive, and says whether it did.
func (h *handover) keep(answer func()) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.on {
		return false
	}
	now := time.Now()
	n := 0
	for _, r := range h.backlog {
		if now.Sub(r.at) < backlogFor {
			h.backlog[n] = r
			n++
		}
	}
	h.backlog = h.backlog[:n]
	if len(h.backlog) >= maxBacklog {
		h.backlog = h.backlog[1:]
	}
	h.backlog = append(h.backlog, request{answer: answer, at: now})
	return true
}

// set turns answering on or off and returns what it was and the backlog,
// which it empties.
func (h *handover) set(on bool) (was bool, backlog []request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	was, h.on = h.on, on
	backlog, h.backlog = h.backlog, nil
	return was, backlog
}

// SetActive says whether this Announcer answers and announces on the
// bridge: only the host's one announcer may (see Role). While inactive it
// reads the bridge (Probe works) but writes nothing; gratuitous rounds due
// meanwhile are sent once it is active, and requests for owned VIPs read
// in the last backlogFor are answered at once, so that none goes
// unanswered across a hand-over. Call it after setting the VIPs to answer
// for.
func (a *Announcer) SetActive(on bool) {
	was, backlog := a.handover.set(on)
	if was == on || !on {
		return
	}
	a.wake()
	now := time.Now()
	for _, r := range backlog {
		if now.Sub(r.at) < backlogFor {
			r.answer()
		}
	}
}
