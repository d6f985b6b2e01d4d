package action

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The emulator itself, without a lab: what the Action test relies on it
// doing as GitHub's runner does.

func TestExpand(t *testing.T) {
	c := exprs{"inputs.nodes": "2", "steps.up.outputs.kubeconfig": "/tmp/k", "runner.temp": "/rt"}
	for _, tc := range []struct{ in, want string }{
		{"n=${{ inputs.nodes }}", "n=2"},
		{"${{inputs.nodes}}-${{ runner.temp }}/x", "2-/rt/x"},
		{"k=${{ steps.up.outputs.kubeconfig }}", "k=/tmp/k"},
		{"unset=${{ steps.up.outputs.nothing }}.", "unset=."}, // GitHub: empty
		{"no expression $HOME", "no expression $HOME"},
	} {
		got, err := c.expand(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("expand(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if got, err := c.expand("${{ secrets.TOKEN }}"); err == nil {
		t.Errorf("expand of a context the emulator does not know = %q, want an error", got)
	}
}

func TestReadCommandFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "env")
	data := "A=1\nB=x=y\n\nM<<EOF_1\nline one\n\nline three\nEOF_1\nC=\n"
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readCommandFile(p)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"A": "1", "B": "x=y", "M": "line one\n\nline three", "C": ""}
	if len(got) != len(want) {
		t.Errorf("got %q, want %q", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	for _, bad := range []string{"M<<EOF\nno end\n", "no equals sign\n", "=value\n"} {
		if err := os.WriteFile(p, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := readCommandFile(p); err == nil {
			t.Errorf("readCommandFile(%q) = %q, want an error", bad, got)
		}
	}
}

// testRunner is a job of the test's own user in fresh directories.
func testRunner(t *testing.T, cache *cacheStore) (*runner, *strings.Builder) {
	t.Helper()
	d := t.TempDir()
	log := &strings.Builder{}
	r := &runner{home: filepath.Join(d, "home"), workspace: filepath.Join(d, "work"), temp: filepath.Join(d, "temp"),
		cache: cache, log: log, steps: map[string]map[string]string{}}
	for _, p := range []string{r.home, r.workspace, r.temp} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r.env = map[string]string{"HOME": r.home, "PATH": "/usr/bin:/bin", "RUNNER_TEMP": r.temp, "GITHUB_ACTIONS": "true"}
	return r, log
}

func writeAction(t *testing.T, yml string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	files["action.yml"] = yml
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Steps hand on variables, PATH entries and outputs through the command
// files, one-line and multiline, and the action's outputs map to them.
func TestRunnerCommandFiles(t *testing.T) {
	action := writeAction(t, `
name: t
inputs:
  greeting: {default: hello}
  who: {default: nobody}
outputs:
  said: {value: "${{ steps.second.outputs.said }}"}
runs:
  using: composite
  steps:
    - shell: bash
      id: first
      run: |
        echo "ONE=1" >>"$GITHUB_ENV"
        { echo "LETTER<<END"; echo "Dear ${{ inputs.who }},"; echo; echo "bye"; echo END; } >>"$GITHUB_ENV"
        echo "${{ github.action_path }}/bin" >>"$GITHUB_PATH"
        echo "x=from first" >>"$GITHUB_OUTPUT"
    - shell: bash
      id: second
      env:
        X: ${{ steps.first.outputs.x }}
      run: |
        test "$ONE" = 1
        test "$LETTER" = "$(printf 'Dear you,\n\nbye')"
        test "$X" = "from first"
        test "$(tool)" = tool-ran
        test "$GITHUB_ACTION_PATH" = "${{ github.action_path }}"
        echo "said=${{ inputs.greeting }} ${{ inputs.who }}" >>"$GITHUB_OUTPUT"
`, map[string]string{"bin/tool": "#!/bin/sh\necho tool-ran\n"})
	r, log := testRunner(t, nil)
	out, err := r.runAction(action, "lab", map[string]string{"who": "you"})
	if err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	if out["said"] != "hello you" {
		t.Errorf("output said = %q, want %q", out["said"], "hello you")
	}
	// The job's later steps see the action's outputs, variables and PATH.
	if _, err := r.step("after", `test "${{ steps.lab.outputs.said }}" = "hello you" && test "$ONE" = 1 && tool`); err != nil {
		t.Errorf("a later step: %v\n%s", err, log)
	}
	if _, err := r.runAction(action, "again", map[string]string{"nosuch": "x"}); err == nil {
		t.Error("an input action.yml does not declare was taken")
	}
}

// shell: bash is bash -e -o pipefail: a failing command stops the step,
// even inside a pipeline.
func TestRunnerShellFailsFast(t *testing.T) {
	for _, script := range []string{"false\necho not reached >>\"$GITHUB_OUTPUT\"", "false | cat\necho not reached"} {
		r, log := testRunner(t, nil)
		if _, err := r.step("fails", script); err == nil {
			t.Errorf("%q: the step succeeded", script)
		}
		if strings.Contains(log.String(), "not reached") {
			t.Errorf("%q: ran on after the failure:\n%s", script, log)
		}
	}
}

// actions/cache: a miss saves at the job's end; the next job restores
// the exact key, and a job with a new key restores the newest entry a
// restore key matches, then saves under its own.
func TestRunnerCache(t *testing.T) {
	store := &cacheStore{dir: t.TempDir()}
	yml := `
runs:
  using: composite
  steps:
    - uses: actions/cache@v4
      with:
        path: ~/.cache/x
        key: x-${{ inputs.v }}
        restore-keys: x-
    - shell: bash
      run: mkdir -p ~/.cache/x && echo "${{ inputs.v }}" >>~/.cache/x/runs
inputs:
  v: {default: "1"}
`
	action := writeAction(t, yml, map[string]string{})
	runs := func(v string) string {
		r, log := testRunner(t, store)
		if _, err := r.runAction(action, "c", map[string]string{"v": v}); err != nil {
			t.Fatalf("%v\n%s", err, log)
		}
		if err := r.finish(); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(filepath.Join(r.home, ".cache", "x", "runs"))
		return strings.Join(strings.Fields(string(b)), " ")
	}
	for _, tc := range []struct{ v, want string }{
		{"1", "1"},   // cold: saved as x-1
		{"1", "1 1"}, // exact hit: restored, not saved again
		{"2", "1 2"}, // x-1 by the restore key, saved as x-2
		{"2", "1 2 2"},
	} {
		if got := runs(tc.v); got != tc.want {
			t.Errorf("v=%s: the cached directory's runs %q, want %q", tc.v, got, tc.want)
		}
	}
	if len(store.keys) != 2 {
		t.Errorf("saved %v, want x-1 and x-2 once each", store.keys)
	}
}

// action.yml as the repository has it: the emulator reads it strictly,
// and with a stand-in for hack/ci-lab.sh its steps hand the inputs to the
// script and the script's outputs back as the action's.
func TestActionWiring(t *testing.T) {
	yml, err := os.ReadFile(filepath.Join(repoRoot(), "action.yml"))
	if err != nil {
		t.Fatal(err)
	}
	action := writeAction(t, string(yml), map[string]string{"hack/ci-lab.sh": `#!/bin/bash
set -eu
test "$1" = up
env | grep -E '^(LABCLOUD|GO)[A-Z0-9_]*=' | sort >"$RUNNER_TEMP/seen"
echo "kubeconfig=$LABCLOUD_KUBECONFIG" >>"$GITHUB_OUTPUT"
echo "labcloud=/x/bin/labcloud" >>"$GITHUB_OUTPUT"
echo "vip-range=10.0.0.1-10.0.0.2" >>"$GITHUB_OUTPUT"
`})
	r, log := testRunner(t, &cacheStore{dir: t.TempDir()})
	out, err := r.runAction(action, "lab", map[string]string{"cloud-config": "cc.yaml", "logs-dir": "logs"})
	if err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	want := map[string]string{"kubeconfig": filepath.Join(r.temp, "labcloud.kubeconfig"), "labcloud": "/x/bin/labcloud", "vip-range": "10.0.0.1-10.0.0.2"}
	for k, v := range want {
		if out[k] != v {
			t.Errorf("output %s = %q, want %q", k, out[k], v)
		}
	}
	seen, err := os.ReadFile(filepath.Join(r.temp, "seen"))
	if err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(r.home, ".cache", "labcloud")
	for _, line := range []string{"LABCLOUD_CLOUD_CONFIG=cc.yaml", "LABCLOUD_LOGS=logs", "LABCLOUD_E2E=false",
		"LABCLOUD_NODES=2", "LABCLOUD_CACHE=" + cache, "GOCACHE=" + cache + "/go/build", "GOMODCACHE=" + cache + "/go/mod"} {
		if !strings.Contains(string(seen), line+"\n") {
			t.Errorf("ci-lab.sh ran without %s; it saw:\n%s", line, seen)
		}
	}
	if !strings.Contains(log.String(), "cache key labcloud-Linux-v1.36.3-: miss") {
		t.Errorf("no cache restore was tried:\n%s", log)
	}
}

// The job's user and its sudo, as the Action test uses them: steps run as
// that user, sudo works without a password, and the cache is saved and
// restored as that user even where a root step wrote into it (as
// hack/ci-lab.sh does, under sudo).
func TestRunnerAsUserWithSudo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it makes the runner's user and its sudoers entry")
	}
	cred := runnerUser(t)
	store := &cacheStore{dir: userDir(t, cred, "cache")}
	yml := `
runs:
  using: composite
  steps:
    - uses: actions/cache@v4
      with: {path: ~/.cache/x, key: k}
    - shell: bash
      id: who
      run: |
        echo "user=$(id -un)" >>"$GITHUB_OUTPUT"
        echo "root=$(sudo id -un)" >>"$GITHUB_OUTPUT"
        mkdir -p ~/.cache/x
        sudo sh -c 'umask 022; echo by-root >>"$1"' _ ~/.cache/x/file
outputs:
  user: {value: "${{ steps.who.outputs.user }}"}
  root: {value: "${{ steps.who.outputs.root }}"}
`
	for i, want := range []string{"by-root", "by-root by-root"} {
		r, base := newJob(t, cred, store, "job")
		action := filepath.Join(base, "action")
		if err := os.Mkdir(action, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(action, "action.yml"), []byte(yml), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := r.runAction(action, "a", nil)
		if err != nil {
			t.Fatal(err)
		}
		if out["user"] != jobUser || out["root"] != "root" {
			t.Errorf("run %d: steps ran as %q, their sudo as %q; want %s and root", i, out["user"], out["root"], jobUser)
		}
		if err := r.finish(); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		b, _ := os.ReadFile(filepath.Join(r.home, ".cache", "x", "file"))
		if got := strings.Join(strings.Fields(string(b)), " "); got != want {
			t.Errorf("run %d: the cached file holds %q, want %q", i, got, want)
		}
	}
}
