package action

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// jobUser is the runner's user: not root, with passwordless sudo, as on
// GitHub's hosted runners. An existing user of that name is used as it is.
const jobUser = "labci"

// TestActionAsUsersCallIt runs action.yml as GitHub's runner would: a
// fresh clone of this checkout's HEAD, run as a non-root user with sudo,
// followed by a user's next steps: kubectl get nodes; an image of a tiny
// Go app built on the runner; labcloud load image; a Deployment exposed as
// a LoadBalancer; curl of its VIP from the runner's namespace; the cleanup
// step of docs/ci.md.
//
// In make test the job starts with its Action cache restored, as every
// run after a repository's first does: the entry holds this host's tools,
// node image and Go caches (hard links, under the key the Action would
// have saved). LABCLOUD_ACTION_COLD=1 runs a first job with an empty cache
// (it builds every tool: ~20 minutes on 2 cores) and then one with the
// cache it saved, and prints both times:
// LABCLOUD_ACTION_COLD=1 go test -count=1 -timeout 90m -v -run TestActionAsUsersCallIt ./test/action/
func TestActionAsUsersCallIt(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the Action test needs root (it makes the runner's user and its sudoers entry)")
	}
	if testing.Short() {
		t.Skip("-short: the Action test brings a lab up")
	}
	for _, p := range []string{"sudo", "git", "tar"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s is missing: hack/install-deps.sh installs it", p)
		}
	}
	cred := runnerUser(t)
	head := strings.TrimSpace(must(t, "git", "-C", repoRoot(), "rev-parse", "HEAD"))
	t.Logf("action.yml of %s (HEAD: uncommitted changes are not in the clone)", head)

	store := &cacheStore{dir: userDir(t, cred, "cache")}
	if os.Getenv("LABCLOUD_ACTION_COLD") == "" {
		store.seed = seedFromHost
		took := runActionJob(t, cred, store, head, "cache restored")
		fmt.Printf("action: fresh clone to kubeconfig output, cache restored: %s\n", took.Round(time.Second))
		return
	}
	first := runActionJob(t, cred, store, head, "first run")
	restored := runActionJob(t, cred, store, head, "cache restored")
	if len(store.keys) != 1 {
		t.Errorf("cache entries saved: %v, want one (the first run's)", store.keys)
	}
	fmt.Printf("action: fresh clone to kubeconfig output: first run %s, cache restored %s\n",
		first.Round(time.Second), restored.Round(time.Second))
}

// seedFromHost fills an Action cache directory as a first run would have
// left it, from this host's own caches: the tools and the node image
// (LABCLOUD_CACHE), Go's module and build caches. Hard links, made as
// root: the job reads them and, through sudo, adds to them as root, as
// ci-lab.sh does.
func seedFromHost(dir string) error {
	// What the first run built, this host's Go cache holds once it has
	// built this checkout (make build's binaries do not depend on where
	// the checkout is).
	if out, err := exec.Command("make", "-s", "-C", repoRoot(), "build", "BIN="+filepath.Join(dir, ".seed-bin")).CombinedOutput(); err != nil {
		return fmt.Errorf("make build: %w: %s", err, out)
	}
	if err := os.RemoveAll(filepath.Join(dir, ".seed-bin")); err != nil {
		return err
	}
	goEnv := func(name string) (string, error) {
		out, err := exec.Command("go", "env", name).Output()
		return strings.TrimSpace(string(out)), err
	}
	mod, err := goEnv("GOMODCACHE")
	if err != nil {
		return err
	}
	build, err := goEnv("GOCACHE")
	if err != nil {
		return err
	}
	host := os.Getenv("LABCLOUD_CACHE")
	if host == "" {
		host = "/var/cache/labcloud"
	}
	entries, err := filepath.Glob(filepath.Join(host, "*"))
	if err != nil {
		return err
	}
	links := map[string]string{mod: filepath.Join(dir, "go", "mod"), build: filepath.Join(dir, "go", "build")}
	for _, e := range entries {
		if isDir(e) && filepath.Base(e) != "bin" {
			links[e] = filepath.Join(dir, filepath.Base(e))
		}
	}
	for from, to := range links {
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		if out, err := exec.Command("cp", "-al", from, to).CombinedOutput(); err != nil {
			return fmt.Errorf("cp -al %s %s: %w: %s", from, to, err, out)
		}
	}
	return nil
}

// runActionJob is one job; it returns the time from the fresh clone to the
// Action's kubeconfig output.
func runActionJob(t *testing.T, cred *syscall.Credential, store *cacheStore, head, name string) time.Duration {
	r, base := newJob(t, cred, store, name)
	// The runner fetches the Action from its repository: a bare copy of
	// this one stands for it (the job's user may not read root's checkout
	// as a repository: git refuses one another user owns).
	origin := filepath.Join(base, "origin.git")
	must(t, "git", "clone", "--quiet", "--bare", repoRoot(), origin)
	if err := r.chown(origin); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	action := filepath.Join(base, "actions", "labcloud")
	if err := r.asUser("git", "clone", "--quiet", origin, action); err != nil {
		t.Fatalf("git clone as %s: %v", jobUser, err)
	}
	if err := r.asUser("git", "-C", action, "checkout", "--quiet", "--detach", head); err != nil {
		t.Fatal(err)
	}
	out, err := r.runAction(action, "lab", nil)
	took := time.Since(start)
	// The cleanup step of docs/ci.md, if: always().
	defer func() {
		if _, err := r.step("labcloud logs and down", `"$LABCLOUD_ACTION_PATH/hack/ci-lab.sh" down`); err != nil {
			t.Errorf("%s: cleanup step: %v", name, err)
		}
		if logs := r.env["LABCLOUD_LOGS"]; logs == "" || !isFile(filepath.Join(logs, "ccm.log")) {
			t.Errorf("%s: the cleanup step left no ccm.log in LABCLOUD_LOGS (%q)", name, logs)
		}
	}()
	if err != nil {
		t.Fatalf("%s: the Action: %v", name, err)
	}
	t.Logf("%s: fresh clone to kubeconfig output %s; outputs %q", name, took.Round(time.Second), out)
	if out["kubeconfig"] == "" || out["labcloud"] == "" || out["vip-range"] == "" {
		t.Errorf("%s: outputs %q: want kubeconfig, labcloud and vip-range set", name, out)
	}
	userSteps(t, r, name, out["vip-range"])
	if !t.Failed() {
		if err := r.finish(); err != nil { // actions/cache saves after a job that passed
			t.Fatal(err)
		}
	}
	return took
}

// newJob is a job of the runner's user in fresh directories under base:
// its home, workspace and runner.temp, as on a new hosted runner.
func newJob(t *testing.T, cred *syscall.Credential, store *cacheStore, name string) (r *runner, base string) {
	t.Helper()
	base = userDir(t, cred, "job")
	r = &runner{cred: cred, home: filepath.Join(base, "home"), workspace: filepath.Join(base, "work"),
		temp: filepath.Join(base, "temp"), cache: store, log: &prefixLog{t: t, name: name}, steps: map[string]map[string]string{}}
	for _, d := range []string{r.home, r.workspace, r.temp} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r.env = map[string]string{
		"HOME": r.home, "USER": jobUser, "LOGNAME": jobUser, "SHELL": "/bin/bash", "LANG": "C.UTF-8",
		// Go on the PATH, as actions/setup-go leaves it.
		"PATH": "/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"CI":   "true", "GITHUB_ACTIONS": "true", "RUNNER_OS": "Linux", "RUNNER_TEMP": r.temp,
		"GITHUB_WORKSPACE": r.workspace,
	}
	// Modules from this host's module cache: the test's traffic stays here.
	if mod, err := exec.Command("go", "env", "GOMODCACHE").Output(); err == nil {
		if dl := filepath.Join(strings.TrimSpace(string(mod)), "cache", "download"); isDir(dl) {
			r.env["GOPROXY"] = "file://" + dl
		}
	}
	if err := r.chown(base); err != nil {
		t.Fatal(err)
	}
	return r, base
}

// userSteps are what a user's workflow does after the Action (docs/ci.md).
func userSteps(t *testing.T, r *runner, name, vipRange string) {
	step := func(label, script string) map[string]string {
		t.Helper()
		out, err := r.step(label, script)
		if err != nil {
			t.Fatalf("%s: step %q: %v", name, label, err)
		}
		return out
	}
	step("kubectl get nodes", `kubectl get nodes -o wide && kubectl wait --for=condition=Ready node --all --timeout=120s`)

	for _, f := range []string{"main.go", "Dockerfile"} {
		data, err := os.ReadFile(filepath.Join(repoRoot(), "test", "action", "testdata", "app", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(r.workspace, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.chown(r.workspace); err != nil {
		t.Fatal(err)
	}
	// GitHub's runners have Docker; this host may have only Podman (as
	// root: labcloud load image, run with sudo, reads root's store).
	build, rmi := "docker build -t app:ci .", "docker rmi app:ci"
	if exec.Command("docker", "info").Run() != nil {
		build, rmi = "sudo podman build -t app:ci .", "sudo podman rmi app:ci"
	}
	defer func() {
		if _, err := r.step("remove the image", rmi); err != nil {
			t.Logf("%s: %v", name, err)
		}
	}()
	step("build the app's image", "CGO_ENABLED=0 go build -o app main.go\n"+build)
	step("load it", `sudo "${{ steps.lab.outputs.labcloud }}" load image app:ci`)
	step("deploy and expose it", `kubectl create deployment app --image=app:ci --port=8080
kubectl rollout status deployment/app --timeout=5m
kubectl expose deployment app --type=LoadBalancer --port=80 --target-port=8080`)
	out := step("curl its VIP from the runner", `kubectl wait --for=jsonpath='{.status.loadBalancer.ingress}' service/app --timeout=2m
vip=$(kubectl get service app -o jsonpath='{.status.loadBalancer.ingress[0].ip}')
curl -fsS --max-time 5 --retry 10 --retry-delay 2 --retry-all-errors "http://$vip/" | tee answer
grep -q '^app:ci on app-' answer
echo "vip=$vip" >>"$GITHUB_OUTPUT"`)
	if !inRanges(out["vip"], vipRange) {
		t.Errorf("%s: the Service's VIP %s is not in the Action's vip-range %q", name, out["vip"], vipRange)
	}
}

// inRanges says ip is in one of ranges, comma-separated FIRST-LAST.
func inRanges(ip, ranges string) bool {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return false
	}
	for _, r := range strings.Split(ranges, ",") {
		lo, hi, _ := strings.Cut(strings.TrimSpace(r), "-")
		l, err1 := netip.ParseAddr(lo)
		h, err2 := netip.ParseAddr(hi)
		if err1 == nil && err2 == nil && l.Compare(a) <= 0 && a.Compare(h) <= 0 {
			return true
		}
	}
	return false
}

// runnerUser returns the job's user, made (with a sudoers entry) for the
// test when missing and removed after it.
func runnerUser(t *testing.T) *syscall.Credential {
	t.Helper()
	if _, err := user.Lookup(jobUser); err != nil {
		must(t, "useradd", "--create-home", "--shell", "/bin/bash", jobUser)
		t.Cleanup(func() { _ = exec.Command("userdel", "--remove", jobUser).Run() })
	}
	sudoers := "/etc/sudoers.d/labcloud-action-test"
	if err := os.WriteFile(sudoers, []byte(jobUser+" ALL=(ALL) NOPASSWD:ALL\n"), 0o440); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(sudoers) })
	u, err := user.Lookup(jobUser)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// userDir is a new directory the job's user owns, removed after the test
// (t.TempDir's parent is root's alone).
func userDir(t *testing.T, cred *syscall.Credential, name string) string {
	t.Helper()
	d, err := os.MkdirTemp("/var/tmp", "labcloud-action-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(d, int(cred.Uid), int(cred.Gid)); err != nil {
		t.Fatal(err)
	}
	return d
}

func must(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func isDir(p string) bool  { fi, err := os.Stat(p); return err == nil && fi.IsDir() }
func isFile(p string) bool { fi, err := os.Stat(p); return err == nil && fi.Mode().IsRegular() }

// prefixLog writes the job's output to the test log, a line at a time.
type prefixLog struct {
	t    *testing.T
	name string
	part []byte
}

func (l *prefixLog) Write(p []byte) (int, error) {
	l.part = append(l.part, p...)
	for {
		i := strings.IndexByte(string(l.part), '\n')
		if i < 0 {
			return len(p), nil
		}
		l.t.Logf("[%s] %s", l.name, l.part[:i])
		l.part = l.part[i+1:]
	}
}
