package action

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/labcloud/labcloud/lab/controlplane"
)

// hostTools is the host's complete tools directory (make tools), as the lab
// finds it; the test skips without one.
func hostTools(t *testing.T) string {
	t.Helper()
	d, err := controlplane.FindTools()
	if err != nil {
		t.Skip(err)
	}
	return d
}

// buildTools runs hack/build-tools.sh with env until it exits or says it is
// building something, which it then stops: the test asks what it would
// build, not for the build (minutes of Kubernetes). It returns the names
// of what it set out to build and its last line of output.
func buildTools(t *testing.T, env ...string) (building []string, last string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot(), "hack", "build-tools.sh"))
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "building "); ok {
			building = append(building, strings.Fields(rest)[0])
			_ = cmd.Cancel()
		}
	}
	err = cmd.Wait()
	if len(building) == 0 && err != nil {
		t.Fatalf("build-tools.sh: %v\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	return building, lines[len(lines)-1]
}

// A CI job that never runs Kubernetes' e2e tests gets a cache without
// e2e.test and ginkgo; a later job that asks for them builds only those,
// into the same directory.
func TestBuildToolsE2EOptional(t *testing.T) {
	tools := hostTools(t)
	cache := t.TempDir()
	dir := filepath.Join(cache, filepath.Base(tools))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(tools)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if n := e.Name(); n != "e2e.test" && n != "ginkgo" && n != ".complete" {
			if err := os.Symlink(filepath.Join(tools, n), filepath.Join(dir, n)); err != nil {
				t.Fatal(err)
			}
		}
	}

	building, last := buildTools(t, "LABCLOUD_CACHE="+cache, "LABCLOUD_E2E=false")
	if len(building) > 0 {
		t.Fatalf("LABCLOUD_E2E=false: build-tools.sh set out to build %v, want nothing", building)
	}
	if last != dir {
		t.Errorf("LABCLOUD_E2E=false: last line %q, want the cache directory %s", last, dir)
	}
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err != nil {
		t.Errorf("LABCLOUD_E2E=false: the lab's tools are all there but the marker is not: %v", err)
	}

	building, _ = buildTools(t, "LABCLOUD_CACHE="+cache, "LABCLOUD_E2E=true")
	if len(building) != 1 || building[0] != "e2e.test" {
		t.Errorf("LABCLOUD_E2E=true on a cache without e2e.test: build-tools.sh set out to build %v, want [e2e.test] first", building)
	}
}
