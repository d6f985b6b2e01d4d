package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/labcloud/labcloud/lab"
)

// Options configure Run.
type Options struct {
	Duration time.Duration
	Seed     int64
	// Verbose prints every broken invariant as it appears and clears,
	// excused or not.
	Verbose bool
	// CheckOnly checks the invariants for Duration without injecting
	// anything (is the lab healthy before a soak?).
	CheckOnly bool
	Out       io.Writer
}

// ErrViolations is returned (wrapped) by Run when an invariant broke.
var ErrViolations = errors.New("invariants violated")

// Run injects the faults of a seeded plan into the running lab for
// opts.Duration while checking its invariants continuously, then removes
// the Services it made and returns what happened. It runs as root inside
// the lab's namespace. The error wraps ErrViolations when an invariant
// broke beyond its settle time.
func Run(ctx context.Context, st *lab.State, opts Options) (Summary, error) {
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	if st.Light {
		return Summary{}, errors.New("chaos needs a lab with guests and libvirtd, not a light one")
	}
	if st.Routed {
		return Summary{}, errors.New("chaos judges VIPs by ARP on the first host's segment; a routed lab's VIPs are on none (up without --routed)")
	}
	client, err := lab.AdminClient(st.Kubeconfig)
	if err != nil {
		return Summary{}, err
	}
	if !opts.CheckOnly {
		if err := ensureNamespace(ctx, client, Namespace); err != nil {
			return Summary{}, err
		}
	}
	lan, err := lanClient(st.Addressing)
	if err != nil {
		return Summary{}, fmt.Errorf("LAN client on %s: %w", lab.Bridge, err)
	}
	defer lan.Close()
	prober, err := lan.Capture()
	if err != nil {
		return Summary{}, err
	}
	defer prober.Close()

	r := &session{
		opts: opts, tr: NewTracker(), out: &linePrinter{w: opts.Out},
		obs: newObserver(st, client, prober),
	}
	r.inj = &injector{st: st, client: client, obs: r.obs}
	start := time.Now()
	r.out.printf("chaos: seed %d, %s, nodes %v, LAN client %s on %s", opts.Seed, opts.Duration, st.Nodes, lan.Addr(), lab.Bridge)

	checkCtx, stopChecks := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.checkLoop(checkCtx)
	}()
	runErr := r.faultLoop(ctx, start.Add(opts.Duration), st.Nodes)
	stopChecks()
	wg.Wait()

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := deleteServices(cctx, client); err != nil {
		runErr = errors.Join(runErr, err)
	}
	r.mu.Lock()
	sum := r.tr.Summary(opts.Seed, time.Since(start), r.skipped)
	r.mu.Unlock()
	sum.Write(opts.Out)
	if runErr != nil {
		return sum, runErr
	}
	if len(sum.Violations) > 0 {
		return sum, fmt.Errorf("%d %w", len(sum.Violations), ErrViolations)
	}
	return sum, nil
}

type session struct {
	opts Options
	obs  *observer
	inj  *injector
	out  *linePrinter

	mu      sync.Mutex // guards the fields below
	tr      *Tracker
	latest  *Snapshot
	skipped int
}

// checkLoop takes snapshots back to back (at most two a second), judges
// each and prints the violations, until ctx ends.
func (r *session) checkLoop(ctx context.Context) {
	var prev *Snapshot
	var shown []Condition
	for ctx.Err() == nil {
		began := time.Now()
		s, err := r.obs.snapshot(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.mu.Lock()
			r.skipped++
			r.mu.Unlock()
			r.out.printf("check skipped: %v", err)
		} else {
			s.End = time.Now()
			conds := Evaluate(prev, s)
			r.mu.Lock()
			vs := r.tr.Observe(s.At, s.End, conds)
			r.latest = s
			r.mu.Unlock()
			if r.opts.Verbose {
				shown = r.showChanges(shown, conds)
			}
			for _, v := range vs {
				r.out.line(v.String())
			}
			prev = s
		}
		sleep(ctx, 500*time.Millisecond-time.Since(began))
	}
}

// showChanges prints conditions that appeared or cleared since shown.
func (r *session) showChanges(shown, now []Condition) []Condition {
	ids := map[string]bool{}
	for _, c := range now {
		ids[c.ID()] = true
	}
	was := map[string]bool{}
	for _, c := range shown {
		was[c.ID()] = true
		if !ids[c.ID()] {
			r.out.printf("cleared: %s", c.ID())
		}
	}
	for _, c := range now {
		if !was[c.ID()] {
			r.out.printf("broken: %s", c)
		}
	}
	return now
}

// faultLoop injects the plan's faults one at a time until deadline: each
// is injected, held, recovered from; then the loop waits for the
// invariants to hold again (or the settle bound to pass) and the fault's
// gap. A node fault waits until every node can answer for VIPs again, so
// that VIPs always have somewhere to go.
func (r *session) faultLoop(ctx context.Context, deadline time.Time, nodes []string) error {
	if err := r.waitFirstCheck(ctx, 2*time.Minute); err != nil {
		return err
	}
	if r.opts.CheckOnly {
		sleep(ctx, time.Until(deadline))
		return nil
	}
	var losable []string
	for _, h := range r.inj.st.LabHosts()[1:] {
		losable = append(losable, h.Name)
	}
	plan := NewPlan(r.opts.Seed, nodes, losable)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		f := plan.Next()
		if f.Kind.isNode() {
			wait := min(4*time.Minute, time.Until(deadline))
			if err := r.waitNodesEligible(ctx, len(nodes), wait); err != nil {
				r.out.printf("skipping %s: not every node can answer for VIPs yet: %v", f, err)
				continue
			}
		}
		if f.Kind == FaultHostLoss {
			leads, err := lab.ReplicaLeads(ctx, r.inj.st, f.Host)
			if err != nil {
				r.out.printf("skipping %s: cannot tell whether its CCM replica leads: %v", f, err)
				continue
			}
			if leads {
				f.Kind = FaultLeaderHostLoss
			}
		}
		if err := r.runFault(ctx, f); err != nil {
			return err
		}
		r.waitSettled(ctx, f.Kind.policy().Settle+5*time.Second)
		sleep(ctx, f.Gap)
	}
	// Leave the lab as it was found: every node back, checks still on.
	if err := r.waitNodesEligible(ctx, len(nodes), finalWait); err != nil && ctx.Err() == nil {
		r.out.printf("at the end, not every node can answer for VIPs again: %v", err)
	}
	return nil
}

// finalWait bounds the wait for restarted nodes at the end of a run.
const finalWait = 90 * time.Second

// run injects f, holds it and undoes it. The undo runs even when ctx has
// ended, so that an interrupted run leaves the lab whole.
func (r *session) runFault(ctx context.Context, f Fault) error {
	r.out.printf("inject %s", f)
	from := time.Now()
	undo, err := r.inj.inject(ctx, f)
	if err != nil {
		return fmt.Errorf("inject %s: %w", f, err)
	}
	r.mu.Lock()
	id := r.tr.Inject(f.Kind, from, time.Now())
	r.mu.Unlock()
	if undo == nil {
		return nil
	}
	sleep(ctx, f.Hold)
	r.out.printf("recover %s", f.Kind)
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	from = time.Now()
	if err := undo(uctx); err != nil {
		return fmt.Errorf("recover from %s: %w", f, err)
	}
	r.mu.Lock()
	r.tr.Recover(id, from, time.Now())
	r.mu.Unlock()
	return nil
}

func (r *session) waitFirstCheck(ctx context.Context, timeout time.Duration) error {
	return r.waitFor(ctx, timeout, func() bool { return r.latest != nil })
}

func (r *session) waitSettled(ctx context.Context, timeout time.Duration) {
	_ = r.waitFor(ctx, timeout, func() bool { return r.tr.Settled() })
}

// waitNodesEligible waits until a check made after the call finds all n
// nodes eligible to answer for VIPs.
func (r *session) waitNodesEligible(ctx context.Context, n int, timeout time.Duration) error {
	since := time.Now()
	return r.waitFor(ctx, timeout, func() bool {
		return r.latest != nil && r.latest.At.After(since) && len(eligibleMACs(r.latest)) == n
	})
}

// waitFor polls cond (called with r.mu held) until it holds.
func (r *session) waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return cond(), nil
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("not within %s", timeout)
	}
	return err
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// linePrinter writes timestamped lines from several goroutines.
type linePrinter struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *linePrinter) line(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintln(p.w, s)
}

func (p *linePrinter) printf(format string, args ...any) {
	p.line(time.Now().Format("15:04:05.000") + " " + fmt.Sprintf(format, args...))
}
