package action

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"

	"sigs.k8s.io/yaml"
)

// A small emulation of GitHub's runner for a composite action: what
// action.yml relies on, and nothing it does not (an expression or a step
// key it does not know is an error, so the YAML cannot drift past it).

// actionFile is the part of action.yml's schema the runner reads.
type actionFile struct {
	Name        string            `json:"name"`
	Description string            `json:"description"`
	Branding    map[string]string `json:"branding"`
	Inputs      map[string]struct {
		Description string `json:"description"`
		Default     string `json:"default"`
		Required    bool   `json:"required"`
	} `json:"inputs"`
	Outputs map[string]struct {
		Description string `json:"description"`
		Value       string `json:"value"`
	} `json:"outputs"`
	Runs struct {
		Using string `json:"using"`
		Steps []step `json:"steps"`
	} `json:"runs"`
}

type step struct {
	Name  string            `json:"name"`
	ID    string            `json:"id"`
	If    string            `json:"if"`
	Shell string            `json:"shell"`
	Run   string            `json:"run"`
	Uses  string            `json:"uses"`
	Env   map[string]string `json:"env"`
	With  map[string]string `json:"with"`
}

func loadAction(path string) (*actionFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var a actionFile
	if err := yaml.UnmarshalStrict(data, &a); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if a.Runs.Using != "composite" {
		return nil, fmt.Errorf("%s: runs.using %q: only composite actions are emulated", path, a.Runs.Using)
	}
	return &a, nil
}

// runner is one job: its user, directories, environment and the PATH
// entries and variables earlier steps handed on.
type runner struct {
	cred      *syscall.Credential // nil: the test's own user
	home      string
	workspace string // each step's working directory (github.workspace)
	temp      string // runner.temp
	env       map[string]string
	path      []string // GITHUB_PATH entries, newest first
	cache     *cacheStore
	log       io.Writer
	// saves are the post-job cache saves of the uses: steps run so far.
	saves []func() error
	steps map[string]map[string]string // the job's step outputs by id
}

// exprs is what ${{ }} expressions resolve against: flat names such as
// inputs.nodes, github.action_path, steps.up.outputs.kubeconfig.
type exprs map[string]string

var exprRe = regexp.MustCompile(`\$\{\{\s*(.*?)\s*\}\}`)

// expand substitutes every ${{ NAME }} in s, as the runner does before a
// step runs. An output or input nobody set is empty, as on GitHub; a
// name outside the contexts the emulator knows is an error.
func (c exprs) expand(s string) (string, error) {
	var bad []string
	out := exprRe.ReplaceAllStringFunc(s, func(m string) string {
		name := exprRe.FindStringSubmatch(m)[1]
		if v, ok := c[name]; ok {
			return v
		}
		if strings.HasPrefix(name, "steps.") && strings.Contains(name, ".outputs.") {
			return ""
		}
		bad = append(bad, name)
		return m
	})
	if len(bad) > 0 {
		return "", fmt.Errorf("expressions the emulator does not know: %s", strings.Join(bad, ", "))
	}
	return out, nil
}

// runAction runs the composite action at dir (its action.yml) with the
// given inputs, as a step with id, and returns the action's outputs.
func (r *runner) runAction(dir, id string, inputs map[string]string) (map[string]string, error) {
	a, err := loadAction(filepath.Join(dir, "action.yml"))
	if err != nil {
		return nil, err
	}
	ctx := exprs{"github.action_path": dir, "github.action_ref": "", "github.workspace": r.workspace,
		"runner.temp": r.temp, "runner.os": "Linux"}
	for name, in := range a.Inputs {
		ctx["inputs."+name] = in.Default
	}
	for name, v := range inputs {
		if _, ok := a.Inputs[name]; !ok {
			return nil, fmt.Errorf("input %q: action.yml has no such input", name)
		}
		ctx["inputs."+name] = v
	}
	for i, s := range a.Runs.Steps {
		label := fmt.Sprintf("%s step %d (%s)", id, i+1, s.Name)
		if s.If != "" {
			return nil, fmt.Errorf("%s: if: is not emulated", label)
		}
		var outputs map[string]string
		switch {
		case s.Uses != "":
			err = r.uses(label, s, ctx)
		case s.Shell != "bash":
			err = fmt.Errorf("shell %q: only bash is emulated", s.Shell)
		default:
			outputs, err = r.run(label, s.Run, s.Env, ctx, dir)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", label, err)
		}
		for k, v := range outputs {
			ctx["steps."+s.ID+".outputs."+k] = v
		}
	}
	out := map[string]string{}
	for name, o := range a.Outputs {
		if out[name], err = ctx.expand(o.Value); err != nil {
			return nil, fmt.Errorf("output %s: %w", name, err)
		}
	}
	r.steps[id] = out
	return out, nil
}

// step runs one of the job's own run: steps (after the action), with the
// job's step outputs in its expressions.
func (r *runner) step(name, script string) (map[string]string, error) {
	ctx := exprs{"github.workspace": r.workspace, "runner.temp": r.temp, "runner.os": "Linux"}
	for id, outs := range r.steps {
		for k, v := range outs {
			ctx["steps."+id+".outputs."+k] = v
		}
	}
	return r.run(name, script, nil, ctx, "")
}

// run is a run: step as GitHub runs one: expressions substituted into the
// script and its env, the script written to a file and run by `bash
// --noprofile --norc -eo pipefail FILE` (shell: bash), fresh GITHUB_ENV,
// GITHUB_OUTPUT and GITHUB_PATH files read back after it.
func (r *runner) run(label, script string, stepEnv map[string]string, ctx exprs, actionPath string) (map[string]string, error) {
	script, err := ctx.expand(script)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(r.temp, "step-")
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	for _, f := range []string{"GITHUB_ENV", "GITHUB_OUTPUT", "GITHUB_PATH", "GITHUB_STATE", "script"} {
		files[f] = filepath.Join(dir, strings.ToLower(f))
		if err := os.WriteFile(files[f], nil, 0o644); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(files["script"], []byte(script), 0o644); err != nil {
		return nil, err
	}
	if err := r.chown(dir); err != nil {
		return nil, err
	}
	env := map[string]string{}
	for k, v := range r.env {
		env[k] = v
	}
	env["PATH"] = strings.Join(append(append([]string{}, r.path...), r.env["PATH"]), ":")
	for _, f := range []string{"GITHUB_ENV", "GITHUB_OUTPUT", "GITHUB_PATH", "GITHUB_STATE"} {
		env[f] = files[f]
	}
	if actionPath != "" {
		env["GITHUB_ACTION_PATH"] = actionPath
	}
	for k, v := range stepEnv {
		if env[k], err = ctx.expand(v); err != nil {
			return nil, fmt.Errorf("env %s: %w", k, err)
		}
	}
	fmt.Fprintf(r.log, "##[group]Run %s\n", label)
	cmd := exec.Command("bash", "--noprofile", "--norc", "-eo", "pipefail", files["script"])
	cmd.Dir = r.workspace
	cmd.Env = envList(env)
	cmd.Stdout, cmd.Stderr = r.log, r.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: r.cred}
	err = cmd.Run()
	fmt.Fprintf(r.log, "##[endgroup]\n")
	if err != nil {
		return nil, err
	}
	set, err := readCommandFile(files["GITHUB_ENV"])
	if err != nil {
		return nil, fmt.Errorf("GITHUB_ENV: %w", err)
	}
	for k, v := range set {
		r.env[k] = v
	}
	paths, err := os.ReadFile(files["GITHUB_PATH"])
	if err != nil {
		return nil, err
	}
	for _, p := range strings.Split(strings.TrimSpace(string(paths)), "\n") {
		if p = strings.TrimSpace(p); p != "" {
			r.path = append([]string{p}, r.path...)
		}
	}
	outputs, err := readCommandFile(files["GITHUB_OUTPUT"])
	if err != nil {
		return nil, fmt.Errorf("GITHUB_OUTPUT: %w", err)
	}
	return outputs, nil
}

// readCommandFile parses a GITHUB_ENV or GITHUB_OUTPUT file: NAME=VALUE
// lines and NAME<<DELIMITER ... DELIMITER blocks for multiline values.
func readCommandFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		if name, delim, ok := strings.Cut(line, "<<"); ok && !strings.Contains(name, "=") {
			var value []string
			closed := false
			for sc.Scan() {
				if sc.Text() == delim {
					closed = true
					break
				}
				value = append(value, sc.Text())
			}
			if !closed {
				return nil, fmt.Errorf("%s: no line %q ends the value of %s", path, delim, name)
			}
			out[name] = strings.Join(value, "\n")
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("%s: %q is neither NAME=VALUE nor NAME<<DELIMITER", path, line)
		}
		out[name] = value
	}
	return out, sc.Err()
}

func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// chown gives path (recursively) to the job's user.
func (r *runner) chown(path string) error {
	if r.cred == nil {
		return nil
	}
	return filepath.Walk(path, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(r.cred.Uid), int(r.cred.Gid))
	})
}

// uses emulates the one action action.yml uses, actions/cache: restore
// now (the exact key, else the newest entry whose key starts with a
// restore key), save at the job's end unless the exact key was hit. Any
// other action is skipped with the reason logged.
func (r *runner) uses(label string, s step, ctx exprs) error {
	if !strings.HasPrefix(s.Uses, "actions/cache@") {
		fmt.Fprintf(r.log, "%s: %s is not emulated: skipped\n", label, s.Uses)
		return nil
	}
	with := map[string]string{}
	for k, v := range s.With {
		e, err := ctx.expand(v)
		if err != nil {
			return fmt.Errorf("with.%s: %w", k, err)
		}
		with[k] = e
	}
	path := with["path"]
	if strings.Contains(strings.TrimSpace(path), "\n") {
		return fmt.Errorf("with.path: several paths are not emulated")
	}
	if rest, ok := strings.CutPrefix(path, "~/"); ok {
		path = filepath.Join(r.home, rest)
	}
	key := with["key"]
	var restoreKeys []string
	for _, k := range strings.Split(with["restore-keys"], "\n") {
		if k = strings.TrimSpace(k); k != "" {
			restoreKeys = append(restoreKeys, k)
		}
	}
	hit, err := r.cache.restore(r, path, key, restoreKeys)
	if err != nil {
		return err
	}
	switch hit {
	case "":
		fmt.Fprintf(r.log, "%s: cache key %s: miss\n", label, key)
	case key:
		fmt.Fprintf(r.log, "%s: cache key %s: hit\n", label, key)
	default:
		fmt.Fprintf(r.log, "%s: cache key %s: restored from %s\n", label, key, hit)
	}
	if hit != key {
		r.saves = append(r.saves, func() error { return r.cache.save(r, path, key) })
	}
	return nil
}

// finish runs the post-job cache saves, as a job that succeeded does.
func (r *runner) finish() error {
	for _, save := range r.saves {
		if err := save(); err != nil {
			return err
		}
	}
	r.saves = nil
	return nil
}

// cacheStore keeps cache entries as tar files named by their keys, in
// the order they were saved. Tar runs as the job's user, as the cache
// action's does: a file that user cannot read fails the save.
type cacheStore struct {
	dir  string
	keys []string
	// seed, when set, stands for an entry saved before the test under the
	// exact key: a restore fills the path with it.
	seed func(path string) error
}

func (c *cacheStore) file(key string) string {
	return filepath.Join(c.dir, strings.NewReplacer("/", "_").Replace(key)+".tar")
}

func (c *cacheStore) restore(r *runner, path, key string, restoreKeys []string) (string, error) {
	if c.seed != nil {
		if err := os.MkdirAll(path, 0o755); err != nil {
			return "", err
		}
		return key, c.seed(path)
	}
	hit := ""
	if _, err := os.Stat(c.file(key)); err == nil {
		hit = key
	} else {
		for _, prefix := range restoreKeys {
			for i := len(c.keys) - 1; i >= 0 && hit == ""; i-- {
				if strings.HasPrefix(c.keys[i], prefix) {
					hit = c.keys[i]
				}
			}
		}
	}
	if hit == "" {
		return "", nil
	}
	if err := os.MkdirAll(path, 0o755); err != nil {
		return "", err
	}
	if err := r.chown(path); err != nil {
		return "", err
	}
	return hit, r.asUser("tar", "-xf", c.file(hit), "-C", path)
}

func (c *cacheStore) save(r *runner, path, key string) error {
	if err := r.asUser("tar", "-cf", c.file(key), "-C", path, "."); err != nil {
		return fmt.Errorf("save cache %s: %w", key, err)
	}
	c.keys = append(c.keys, key)
	return nil
}

// asUser runs a command as the job's user, its output to the log.
func (r *runner) asUser(name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Env = envList(r.env)
	cmd.Stdout, cmd.Stderr = r.log, r.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: r.cred}
	return cmd.Run()
}
