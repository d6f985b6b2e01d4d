package up

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/labcloud/labcloud/lab/guest"
)

// TestSilentConsoles: a guest that wrote to its console is not silent; one
// with an empty or missing console is, once the deadline passes; waiting
// ends early when every guest has written.
func TestSilentConsoles(t *testing.T) {
	dir := t.TempDir()
	path := func(n string) string { return filepath.Join(dir, n) }
	if err := os.WriteFile(path("spoke"), []byte("Linux version"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path("empty"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	guests := map[string]guest.Guest{"spoke": {Console: path("spoke")}, "empty": {Console: path("empty")}, "none": {Console: path("none")}}
	if got := silentConsoles(guests, time.Now().Add(50*time.Millisecond), 10*time.Millisecond); !slices.Equal(got, []string{"empty", "none"}) {
		t.Errorf("silent = %v, want [empty none]", got)
	}
	go func() {
		time.Sleep(30 * time.Millisecond)
		_ = os.WriteFile(path("empty"), []byte("x"), 0o600)
		_ = os.WriteFile(path("none"), []byte("x"), 0o600)
	}()
	start := time.Now()
	if got := silentConsoles(guests, time.Now().Add(5*time.Second), 10*time.Millisecond); len(got) != 0 || time.Since(start) > 3*time.Second {
		t.Errorf("silent = %v after %s, want none, early", got, time.Since(start))
	}
}
