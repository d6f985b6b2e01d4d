package action

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// make test (hack/test-suites.sh) fails when a Go test fails, and runs
// nothing after it: its go test runs through tee for the summary, and a
// pipe's status was tee's. The script runs in a tree of its own, with
// stand-ins for go, make and hack/ci-e2e.sh that say they ran.
func TestTestSuitesFailWhenAGoTestFails(t *testing.T) {
	dir := t.TempDir()
	script, err := os.ReadFile(filepath.Join(repoRoot(), "hack", "test-suites.sh"))
	if err != nil {
		t.Fatal(err)
	}
	ran := filepath.Join(dir, "ran")
	for p, data := range map[string]string{
		"hack/test-suites.sh": string(script),
		"hack/ci-e2e.sh":      "#!/bin/sh\necho ci-e2e >>" + ran + "\n",
		"bin/make":            "#!/bin/sh\necho make \"$@\" >>" + ran + "\n",
		"bin/go":              "#!/bin/sh\nprintf 'FAIL\\texample.test/pkg\\t0.1s\\n'\nexit 1\n",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(filepath.Join(dir, "hack", "test-suites.sh"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+filepath.Join(dir, "bin")+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Errorf("hack/test-suites.sh passed although go test failed:\n%s", out)
	}
	if !strings.Contains(string(out), "packages: 0 passed, 1 failed") {
		t.Errorf("hack/test-suites.sh's summary lacks the failed package:\n%s", out)
	}
	if b, err := os.ReadFile(ran); err == nil {
		t.Errorf("after go test failed, hack/test-suites.sh still ran:\n%s", b)
	}
}
