// Package e2etest holds what the end-to-end suites (test/e2e and
// test/labe2e) share: the checkout under test and the package made from it.
package e2etest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// RepoRoot is the checkout this package was compiled from: the one whose
// binaries and package the suites build and test.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Make runs `make target vars...` in the checkout and fails the test if
// make fails.
func Make(t testing.TB, target string, vars ...string) {
	t.Helper()
	cmd := exec.Command("make", append([]string{"-s", target}, vars...)...)
	cmd.Dir = RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make %s: %v\n%s", target, err, out)
	}
}

// MakeDeb runs `make deb` with its binaries and package under dir and
// returns the one package it made.
func MakeDeb(t testing.TB, dir string) string {
	t.Helper()
	dist := filepath.Join(dir, "dist")
	// An earlier build, as a rebuild finds one: the guide's
	// `apt install ./dist/..._*_amd64.deb` must match one package, or apt
	// asks whether to go on, and a script's apt aborts.
	if err := os.MkdirAll(dist, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dist, "libvirt-cloud-controller-manager_0.0.1_amd64.deb"), []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	Make(t, "deb", "BIN="+filepath.Join(dir, "bin"), "DIST="+dist)
	debs, _ := filepath.Glob(filepath.Join(dist, "*.deb"))
	if len(debs) != 1 {
		t.Fatalf("make deb made %q, want one .deb", debs)
	}
	if fi, err := os.Stat(debs[0]); err == nil {
		t.Logf("%s: %.1f MB", filepath.Base(debs[0]), float64(fi.Size())/1e6)
	}
	return debs[0]
}
