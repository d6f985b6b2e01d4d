package e2etest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRepoRoot: RepoRoot is the checkout's root, whose go.mod names this
// module, so that the suites build and read what they test.
func TestRepoRoot(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(RepoRoot(), "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if first, _, _ := strings.Cut(string(b), "\n"); first != "module github.com/labcloud/labcloud" {
		t.Errorf("%s/go.mod starts %q, want the labcloud module", RepoRoot(), first)
	}
}
