package chaos

import (
	"strings"
	"testing"
	"time"
)

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

var vipDown = Condition{Invariant: InvVIPAnswered, Subject: "10.123.0.200", Detail: "no ARP answer"}

// step is one thing that happens to a Tracker: a fault event or a check.
type step struct {
	inject  FaultKind // inject a fault of this kind from..to
	recover bool      // recover the last injected fault from..to
	from    float64
	to      float64
	conds   []Condition // a check from..to finding these
	want    int         // violations the check reports
}

func TestTracker(t *testing.T) {
	tests := []struct {
		name   string
		steps  []step
		total  int
		settle []string // "kind phase took|unsettled"
	}{
		{name: "broken without a fault", total: 2, steps: []step{
			{from: 0, to: 1, conds: []Condition{vipDown}, want: 1},
			{from: 1, to: 2, conds: []Condition{vipDown}, want: 0}, // the same episode
			{from: 2, to: 3},
			{from: 3, to: 4, conds: []Condition{vipDown}, want: 1}, // a new episode
		}},
		{name: "libvirtd restart: a VIP lost within the settle time is excused", settle: []string{"libvirtd-restart inject 1.5s", "libvirtd-restart recover 0s"}, steps: []step{
			{inject: FaultLibvirtd, from: 10, to: 10.5},
			{from: 11, to: 11.8, conds: []Condition{vipDown}},
			{from: 12, to: 12.8},
			{recover: true, from: 15, to: 15.5},
			{from: 16, to: 16.8},
		}},
		{name: "libvirtd restart: a VIP lost during the outage beyond the settle time", total: 1, settle: []string{"libvirtd-restart inject unsettled 10s", "libvirtd-restart recover 5.5s"}, steps: []step{
			{inject: FaultLibvirtd, from: 10, to: 10.5},
			{from: 11, to: 11.8, conds: []Condition{vipDown}},
			{from: 14, to: 14.8, conds: []Condition{vipDown}, want: 1},
			{recover: true, from: 20, to: 20.5},
			{from: 21, to: 21.8, conds: []Condition{vipDown}},
			{from: 26, to: 26.8},
		}},
		{name: "CCM outage: broken until the restart is excused", settle: []string{"ccm-kill inject unsettled 30s", "ccm-kill recover 20s"}, steps: []step{
			{inject: FaultCCMKill, from: 0, to: 0},
			{from: 10, to: 11, conds: []Condition{vipDown}},
			{from: 25, to: 26, conds: []Condition{vipDown}},
			{recover: true, from: 30, to: 30},
			{from: 45, to: 46, conds: []Condition{vipDown}},
			{from: 50, to: 51},
		}},
		{name: "CCM outage: broken beyond the settle time after the restart", total: 1, steps: []step{
			{inject: FaultCCMKill, from: 0, to: 0},
			{recover: true, from: 1, to: 1},
			{from: 30, to: 31, conds: []Condition{vipDown}},
			{from: 36, to: 37, conds: []Condition{vipDown}},
			{from: 38, to: 39, conds: []Condition{vipDown}, want: 1},
		}},
		{name: "a check that began before the injection but overlaps it is excused", steps: []step{
			{inject: FaultBridgeFlap, from: 10, to: 10},
			{from: 9.5, to: 10.3, conds: []Condition{vipDown}},
		}},
		{name: "a deleted Node is never excused", total: 1, steps: []step{
			{inject: FaultLibvirtd, from: 0, to: 0},
			{from: 1, to: 2, conds: []Condition{{Invariant: InvNodeKept, Subject: "n1"}}, want: 1},
		}},
		{name: "a clean check that began before the event does not settle it", settle: []string{"service-create inject 2s"}, steps: []step{
			{inject: FaultServiceCreate, from: 10, to: 10.2},
			{from: 10, to: 11},
			{from: 11, to: 12, conds: []Condition{vipDown}},
			{from: 12.2, to: 13},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker()
			last := 0
			for i, s := range tt.steps {
				switch {
				case s.inject != "":
					last = tr.Inject(s.inject, at(s.from), at(s.to))
				case s.recover:
					tr.Recover(last, at(s.from), at(s.to))
				default:
					if got := tr.Observe(at(s.from), at(s.to), s.conds); len(got) != s.want {
						t.Errorf("step %d: %d violations %v, want %d", i, len(got), got, s.want)
					}
				}
			}
			if len(tr.Violations) != tt.total {
				t.Errorf("%d violations in all, want %d: %v", len(tr.Violations), tt.total, tr.Violations)
			}
			if tt.settle == nil {
				return
			}
			var got []string
			for _, s := range tr.Settles {
				u := ""
				if s.Unsettled {
					u = "unsettled "
				}
				got = append(got, string(s.Kind)+" "+s.Phase+" "+u+s.Took.String())
			}
			if strings.Join(got, "; ") != strings.Join(tt.settle, "; ") {
				t.Errorf("settles = %q, want %q", got, tt.settle)
			}
		})
	}
}

func TestSettleSummary(t *testing.T) {
	tr := NewTracker()
	for i, took := range []float64{0, 2, 1} {
		base := float64(i * 100)
		id := tr.Inject(FaultNodeKill, at(base), at(base))
		if took > 0 {
			tr.Observe(at(base+0.1), at(base+0.5), []Condition{vipDown})
		}
		tr.Observe(at(base+took), at(base+took+0.5), nil)
		tr.Recover(id, at(base+10), at(base+11))
		tr.Observe(at(base+12), at(base+13), nil)
	}
	sum := tr.Summary(7, time.Minute, 2)
	if sum.Faults[FaultNodeKill] != 3 || sum.Checks != 8 || sum.Skipped != 2 || len(sum.Violations) != 0 {
		t.Errorf("summary = %+v", sum)
	}
	if len(sum.Settle) != 2 {
		t.Fatalf("settle stats = %+v, want inject and recover", sum.Settle)
	}
	inj := sum.Settle[0]
	if inj.Phase != "inject" || inj.Count != 3 || inj.Disturbed != 2 || inj.Median != time.Second || inj.Max != 2*time.Second || inj.Bound != 5*time.Second {
		t.Errorf("inject stats = %+v", inj)
	}
	var b strings.Builder
	sum.Write(&b)
	for _, want := range []string{"faults injected: 3 (node-kill=3)", "checks: 8 (2 skipped", "node-kill", "violations: 0"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("summary text lacks %q:\n%s", want, b.String())
		}
	}
}
