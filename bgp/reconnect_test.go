package bgp

import (
	"slices"
	"testing"
	"time"
)

func TestHoldDown(t *testing.T) {
	var got []time.Duration
	for n := 1; n <= 9; n++ {
		got = append(got, holdDown(n))
	}
	want := []time.Duration{0, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute, time.Minute}
	if !slices.Equal(got, want) {
		t.Errorf("holds after 1..9 failures = %v, want %v", got, want)
	}
}

// paceRun drives a pacer second by second for span against a peer whose
// session state is a function of the time and of how long GoBGP has been
// let to connect (since the last enable, or the start): up, and whether
// the session was shut by the prefix limit (GoBGP then disables it). It
// returns each hold-down: when it started and how long it lasted.
func paceRun(span time.Duration, peer func(at, trying time.Duration) (up, shut bool)) (holds [][2]time.Duration) {
	start := time.Unix(1e9, 0)
	p := newPacer(start)
	enabled, enabledAt := true, time.Duration(0)
	var heldAt time.Duration
	for at := time.Second; at <= span; at += time.Second {
		up, shut := false, false
		if enabled {
			up, shut = peer(at, at-enabledAt)
		}
		if shut {
			enabled = false
		}
		switch p.step(up, enabled, start.Add(at)) {
		case paceDisable:
			enabled, heldAt = false, at
		case paceEnable:
			if heldAt != 0 {
				holds = append(holds, [2]time.Duration{heldAt, at - heldAt})
			}
			enabled, enabledAt, heldAt = true, at, 0
		}
	}
	return holds
}

func durations(holds [][2]time.Duration) []time.Duration {
	var d []time.Duration
	for _, h := range holds {
		d = append(d, h[1])
	}
	return d
}

func TestPacerBacksOff(t *testing.T) {
	s := time.Second
	// A router that never answers: two windows at GoBGP's own pace,
	// then holds doubling to a minute.
	holds := paceRun(6*time.Minute, func(_, _ time.Duration) (bool, bool) { return false, false })
	if want := []time.Duration{2 * s, 4 * s, 8 * s, 16 * s, 32 * s, 60 * s, 60 * s, 60 * s}; !slices.Equal(durations(holds), want) {
		t.Errorf("never answering: holds %v, want %v", holds, want)
	}
	if len(holds) > 0 && holds[0][0] != 20*s {
		t.Errorf("never answering: first hold at %s, want 20s (two windows of 10s first)", holds[0][0])
	}

	// A session that comes up and is cut 3 s later, again and again
	// (flapping, or a peer past the prefix limit): held down as long.
	for _, shut := range []bool{false, true} {
		holds = paceRun(6*time.Minute, func(_, trying time.Duration) (bool, bool) {
			if trying >= 8*s {
				return false, shut
			}
			return trying >= 5*s, false
		})
		if want := []time.Duration{2 * s, 4 * s, 8 * s, 16 * s, 32 * s, 60 * s}; len(holds) < len(want) || !slices.Equal(durations(holds)[:len(want)], want) {
			t.Errorf("cut after 3 s (prefix limit %v): holds %v, want %v first", shut, holds, want)
		}
	}

	// A router that restarts (down 30 s) after a good session: no hold
	// for the first 20 s, and back at once when it is.
	holds = paceRun(5*time.Minute, func(at, _ time.Duration) (bool, bool) {
		return at < 2*time.Minute || at >= 2*time.Minute+30*s, false
	})
	if want := [][2]time.Duration{{2*time.Minute + 20*s, 2 * s}}; !slices.Equal(holds, want) {
		t.Errorf("router restart: holds %v, want %v", holds, want)
	}

	// After a session that stays up a minute, failures start over.
	holds = paceRun(10*time.Minute, func(at, _ time.Duration) (bool, bool) {
		return at >= 3*time.Minute && at < 5*time.Minute, false
	})
	var after []time.Duration
	for _, h := range holds {
		if h[0] > 5*time.Minute {
			after = append(after, h[1])
		}
	}
	if len(after) < 3 || !slices.Equal(after[:3], []time.Duration{2 * s, 4 * s, 8 * s}) {
		t.Errorf("after a good session: holds %v, want 2s 4s 8s first", after)
	}
}
