package up

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/labcloud/labcloud/lab"
)

// counter is an action that counts its runs and fails with err.
type counter struct {
	runs int
	err  error
}

func (a *counter) Execute(context.Context, *Env) error { a.runs++; return a.err }

// TestRunStopsAtTheFirstFailure: steps run in order and are recorded in
// the saved state; after one fails none runs, and the error names it.
func TestRunStopsAtTheFirstFailure(t *testing.T) {
	var out strings.Builder
	r, err := begin(context.Background(), lab.Options{Nodes: 1, Light: true, Dir: t.TempDir(), Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	first := do(r, "first", &counter{})
	failing := do(r, "second", &counter{err: errors.New("no disk")})
	third := do(r, "third", &counter{})
	if first.runs != 1 || failing.runs != 1 || third.runs != 0 {
		t.Errorf("runs %d, %d, %d; want 1, 1, 0", first.runs, failing.runs, third.runs)
	}
	if r.err == nil || r.err.Error() != "second: no disk" {
		t.Errorf("err = %v, want the failing step's name and its error", r.err)
	}
	saved, err := lab.LoadState(r.env.State.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(saved.Steps) != 1 || saved.Steps[0].Name != "first" {
		t.Errorf("saved steps %+v, want first only", saved.Steps)
	}
	if !strings.Contains(out.String(), "] first done in ") || !strings.Contains(out.String(), "] second ...") || strings.Contains(out.String(), "third") {
		t.Errorf("progress:\n%s", out.String())
	}
}
