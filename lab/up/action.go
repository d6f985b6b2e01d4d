package up

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/labcloud/labcloud/lab"
)

// Env is what every action is given besides its own fields: the options
// up was given, and the lab's State, in which an action records what
// Down, Status and the other commands need of what it made (pids, files,
// nodes). It is saved after each action.
type Env struct {
	Opts  lab.Options
	State *lab.State
}

// say writes a line of progress under its step's.
func (e *Env) say(format string, args ...any) {
	fmt.Fprintf(e.Opts.Out, "           "+format+"\n", args...)
}

// addresses are the lab's addresses of its family.
func (e *Env) addresses() lab.Addresses { return e.State.Addressing.Of(e.State.IPFamily) }

// repo is the labcloud checkout to build from: Options.Repo, else the
// current directory.
func (e *Env) repo() string {
	if e.Opts.Repo != "" {
		return e.Opts.Repo
	}
	wd, _ := os.Getwd()
	return wd
}

// An action is one step of up.
type action interface {
	Execute(ctx context.Context, env *Env) error
}

// run is one up: its actions run in order, each a step timed and recorded
// in the state, until one fails; after that none runs, and err says why.
type run struct {
	ctx   context.Context
	env   *Env
	start time.Time
	err   error
}

// begin checks opts and records the lab about to be made in opts.Dir.
func begin(ctx context.Context, opts lab.Options) (*run, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, err
	}
	r := &run{ctx: ctx, env: &Env{Opts: opts, State: lab.NewState(opts)}, start: time.Now()}
	return r, r.env.State.Save()
}

// do runs a as the step called name, unless a step before failed, and
// returns a, whose fields then hold what it made. a's inputs are the
// actions before it, given as pointers and read only when a runs.
func do[A action](r *run, name string, a A) A {
	if r.err == nil {
		r.err = r.step(name, a)
	}
	return a
}

func (r *run) step(name string, a action) error {
	out, st := r.env.Opts.Out, r.env.State
	t := time.Now()
	fmt.Fprintf(out, "[%6.1fs] %s ...\n", time.Since(r.start).Seconds(), name)
	if err := a.Execute(r.ctx, r.env); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	d := time.Since(t).Seconds()
	st.Steps = append(st.Steps, lab.Step{Name: name, Seconds: d})
	_ = st.Save()
	fmt.Fprintf(out, "[%6.1fs] %s done in %.1fs\n", time.Since(r.start).Seconds(), name, d)
	return nil
}
