package chaos

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"
)

// Violation is a broken invariant that no settle time excuses.
type Violation struct {
	At        time.Time
	Condition Condition
	// After is the last fault event before it, for the report.
	After string
}

func (v Violation) String() string {
	s := fmt.Sprintf("%s VIOLATION %s", v.At.Format("15:04:05.000"), v.Condition)
	if v.After != "" {
		s += " [" + v.After + "]"
	}
	return s
}

// faultEvent is an injection or a recovery.
type faultEvent struct {
	kind  FaultKind
	phase string // "inject" or "recover"
	at    time.Time
}

// excuse is a time window in which broken invariants are expected.
type excuse struct{ from, to time.Time }

// Settle is how long the invariants took to hold again after one fault
// event (its kind and phase), as observed by the checks.
type Settle struct {
	Kind  FaultKind
	Phase string
	// Took is the time from the event to the first check that found every
	// invariant holding; 0 when no check after the event found one broken.
	Took time.Duration
	// Unsettled: another event came before any check found the invariants
	// holding; Took is then the time until that event.
	Unsettled bool
}

// Tracker turns the conditions of successive checks into violations,
// given the faults injected, and measures settle times. It is pure: times
// come from the caller. It is not safe for concurrent use.
type Tracker struct {
	excuses    []excuse
	open       map[int]int // fault id -> index of its open-ended excuse (outage faults)
	faults     map[int]faultEvent
	nextID     int
	last       *faultEvent
	pending    *faultEvent // the event whose settle time is being measured
	dirty      bool        // a check since pending found a condition
	active     map[string]bool
	Checks     int
	Violations []Violation
	Settles    []Settle
	Injected   map[FaultKind]int
}

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker {
	return &Tracker{open: map[int]int{}, faults: map[int]faultEvent{}, active: map[string]bool{}, Injected: map[FaultKind]int{}}
}

// Inject records a fault of kind that began to be injected at from and
// was in place at at (the domain down, the daemon gone). Broken
// invariants are expected from from on: for an outage until Settle after
// its recovery, else until Settle after at. Settle times count from at.
func (t *Tracker) Inject(kind FaultKind, from, at time.Time) int {
	t.nextID++
	id := t.nextID
	pol := kind.policy()
	ev := faultEvent{kind: kind, phase: "inject", at: at}
	t.faults[id] = ev
	t.Injected[kind]++
	if pol.Outage {
		t.open[id] = len(t.excuses)
		t.excuses = append(t.excuses, excuse{from: from})
	} else {
		t.excuses = append(t.excuses, excuse{from: from, to: at.Add(pol.Settle)})
	}
	t.event(ev)
	return id
}

// Recover records that fault id began to be undone at from and was undone
// at at (the domain started, the daemon restarted, the bridge back).
// Faults with nothing to undo (Services) are never recovered.
func (t *Tracker) Recover(id int, from, at time.Time) {
	ev, ok := t.faults[id]
	if !ok {
		return
	}
	delete(t.faults, id)
	settle := ev.kind.policy().Settle
	if i, ok := t.open[id]; ok {
		t.excuses[i].to = at.Add(settle)
		delete(t.open, id)
	} else {
		t.excuses = append(t.excuses, excuse{from: from, to: at.Add(settle)})
	}
	t.event(faultEvent{kind: ev.kind, phase: "recover", at: at})
}

func (t *Tracker) event(ev faultEvent) {
	if t.pending != nil {
		t.Settles = append(t.Settles, Settle{Kind: t.pending.kind, Phase: t.pending.phase, Took: ev.at.Sub(t.pending.at), Unsettled: true})
	}
	t.pending, t.dirty, t.last = &ev, false, &ev
}

// Settled reports whether a check has found every invariant holding since
// the last fault event.
func (t *Tracker) Settled() bool { return t.pending == nil }

// excused reports whether broken invariants are expected at some moment
// of [from, to].
func (t *Tracker) excused(from, to time.Time) bool {
	for _, e := range t.excuses {
		if !to.Before(e.from) && (e.to.IsZero() || !from.After(e.to)) {
			return true
		}
	}
	return false
}

// Observe takes the conditions of a check of a snapshot taken from at to
// end and returns the violations it reveals: immediate conditions always,
// others when no fault excuses them, once per episode (a condition that
// stays broken over several checks is one violation).
func (t *Tracker) Observe(at, end time.Time, conds []Condition) []Violation {
	t.Checks++
	if p := t.pending; p != nil {
		switch {
		case len(conds) > 0 && !end.Before(p.at):
			t.dirty = true
		case len(conds) == 0 && !at.Before(p.at):
			took := time.Duration(0)
			if t.dirty {
				took = at.Sub(p.at)
			}
			t.Settles = append(t.Settles, Settle{Kind: p.kind, Phase: p.phase, Took: took})
			t.pending = nil
		}
	}
	excused := t.excused(at, end)
	seen := map[string]bool{}
	var out []Violation
	for _, c := range conds {
		id := c.ID()
		seen[id] = true
		if c.Immediate() || (!excused && !t.active[id]) {
			if !c.Immediate() {
				t.active[id] = true
			}
			out = append(out, Violation{At: at, Condition: c, After: t.describeLast(at)})
		}
	}
	for id := range t.active {
		if !seen[id] {
			delete(t.active, id)
		}
	}
	t.Violations = append(t.Violations, out...)
	return out
}

func (t *Tracker) describeLast(at time.Time) string {
	if t.last == nil {
		return "no fault injected yet"
	}
	return fmt.Sprintf("%s %s at %s, %.1fs before", t.last.kind, t.last.phase, t.last.at.Format("15:04:05.000"), at.Sub(t.last.at).Seconds())
}

// SettleStats summarise the settle times of one kind and phase.
type SettleStats struct {
	Kind      FaultKind     `json:"kind"`
	Phase     string        `json:"phase"`
	Count     int           `json:"count"`
	Disturbed int           `json:"disturbed"` // events after which a check found an invariant broken
	Unsettled int           `json:"unsettled"`
	Median    time.Duration `json:"median"`
	Max       time.Duration `json:"max"`
	Bound     time.Duration `json:"bound"`
}

func (s SettleStats) String() string {
	out := fmt.Sprintf("%-17s %-8s n=%-3d disturbed=%-3d median=%-6s max=%-6s (bound %s)", s.Kind, s.Phase, s.Count, s.Disturbed,
		s.Median.Round(100*time.Millisecond), s.Max.Round(100*time.Millisecond), s.Bound)
	if s.Unsettled > 0 {
		out += fmt.Sprintf(", %d not settled before the next event", s.Unsettled)
	}
	return out
}

// SettleSummary groups the settle times by kind and phase, in a fixed order.
func (t *Tracker) SettleSummary() []SettleStats {
	groups := map[[2]string][]Settle{}
	for _, s := range t.Settles {
		k := [2]string{string(s.Kind), s.Phase}
		groups[k] = append(groups[k], s)
	}
	var out []SettleStats
	for _, k := range reportedKinds() {
		for _, phase := range []string{"inject", "recover"} {
			g := groups[[2]string{string(k), phase}]
			if len(g) == 0 {
				continue
			}
			st := SettleStats{Kind: k, Phase: phase, Count: len(g), Bound: k.policy().Settle}
			var took []time.Duration
			for _, s := range g {
				if s.Unsettled {
					st.Unsettled++
				}
				if s.Took > 0 {
					st.Disturbed++
				}
				took = append(took, s.Took)
			}
			slices.Sort(took)
			st.Median, st.Max = took[len(took)/2], took[len(took)-1]
			out = append(out, st)
		}
	}
	return out
}

// Summary is the end of a chaos run.
type Summary struct {
	Seed       int64             `json:"seed"`
	Duration   time.Duration     `json:"duration"`
	Faults     map[FaultKind]int `json:"faults"`
	Checks     int               `json:"checks"`
	Skipped    int               `json:"skippedChecks"` // snapshots that could not be taken whole
	Violations []string          `json:"violations"`
	Settle     []SettleStats     `json:"settle"`
}

// Summary is the tracker's account of the run.
func (t *Tracker) Summary(seed int64, d time.Duration, skipped int) Summary {
	s := Summary{Seed: seed, Duration: d, Faults: map[FaultKind]int{}, Checks: t.Checks, Skipped: skipped, Settle: t.SettleSummary(), Violations: []string{}}
	for k, n := range t.Injected {
		s.Faults[k] = n
	}
	for _, v := range t.Violations {
		s.Violations = append(s.Violations, v.String())
	}
	return s
}

// Write prints the summary for people.
func (s Summary) Write(b io.Writer) {
	fmt.Fprintf(b, "chaos summary: seed %d, %s\n", s.Seed, s.Duration.Round(time.Second))
	var kinds []string
	total := 0
	for k, n := range s.Faults {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
		total += n
	}
	sort.Strings(kinds)
	fmt.Fprintf(b, "faults injected: %d (%s)\n", total, strings.Join(kinds, " "))
	fmt.Fprintf(b, "checks: %d (%d skipped: snapshot incomplete)\n", s.Checks, s.Skipped)
	fmt.Fprintf(b, "settle times (from the event to the first check with every invariant holding):\n")
	for _, st := range s.Settle {
		fmt.Fprintf(b, "  %s\n", st)
	}
	fmt.Fprintf(b, "violations: %d\n", len(s.Violations))
	for _, v := range s.Violations {
		fmt.Fprintf(b, "  %s\n", v)
	}
}
