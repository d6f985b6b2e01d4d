package bgp

import "time"

// Reconnects back off. GoBGP v4 has no back-off of its own: it dials a
// lost peer every ConnectRetry seconds forever, and a peer that takes the
// connection and drops it (or a session the prefix limit shuts) is tried
// again as fast. So the speaker paces each peer itself, with GoBGP's
// administrative state: a failed attempt holds the peer down (disabled)
// for a while, doubling up to holdMax, before GoBGP may try again.
//
// An attempt is the time GoBGP is left to connect, connectWindow; it
// fails if no session comes up in it, or if the session ends within
// stableSession (flapping, or shut by the prefix limit). A session that
// stays up stableSession clears the failures, so a router that restarts
// after a good session is reconnected at once, as GoBGP does (within its
// 5 s idle hold and 2 s connect retry), and so is the first failure after it:
// holds are 0, 2 s, 4 s … 60 s.
const (
	connectWindow = 10 * time.Second // GoBGP's idle hold (5 s) and first dial (2 s) with room
	stableSession = time.Minute
	holdMin       = 2 * time.Second
	holdMax       = time.Minute
)

// holdDown is how long a peer is held down after its n-th failed attempt
// in a row.
func holdDown(n int) time.Duration {
	if n <= 1 {
		return 0
	}
	d := holdMin
	for ; n > 2 && d < holdMax; n-- {
		d *= 2
	}
	return min(d, holdMax)
}

// pace is what a pacer asks of GoBGP for its peer.
type pace int

const (
	paceNothing pace = iota
	paceDisable      // hold the peer down
	paceEnable       // let GoBGP connect
)

// pacer paces one peer's reconnects, from its session state sampled every
// second (step).
type pacer struct {
	failures  int       // failed attempts in a row
	from      time.Time // the current attempt's start (zero while the session is up)
	upSince   time.Time // when the session came up; zero while it is down
	heldUntil time.Time // the peer is held down until then; zero if it is not
}

func newPacer(now time.Time) *pacer { return &pacer{from: now} }

// step takes the peer's state now (up: the session is established;
// enabled: GoBGP may connect, which the prefix limit also turns off) and
// says what to do.
func (p *pacer) step(up, enabled bool, now time.Time) pace {
	switch {
	case !p.heldUntil.IsZero():
		if now.Before(p.heldUntil) {
			return paceNothing
		}
		p.heldUntil, p.from = time.Time{}, now
		return paceEnable
	case up:
		if p.upSince.IsZero() {
			p.upSince = now
		}
		if now.Sub(p.upSince) >= stableSession {
			p.failures = 0
		}
		return paceNothing
	case !p.upSince.IsZero(): // the session just ended
		short := now.Sub(p.upSince) < stableSession
		p.upSince, p.from = time.Time{}, now
		if short {
			return p.fail(enabled, now)
		}
	case now.Sub(p.from) >= connectWindow:
		return p.fail(enabled, now)
	}
	return paceNothing
}

// fail counts a failed attempt and holds the peer down for its hold, or
// lets it try again at once.
func (p *pacer) fail(enabled bool, now time.Time) pace {
	p.failures++
	p.from = now
	hold := holdDown(p.failures)
	switch {
	case hold > 0:
		p.heldUntil = now.Add(hold)
		return paceDisable
	case !enabled:
		return paceEnable
	}
	return paceNothing
}
