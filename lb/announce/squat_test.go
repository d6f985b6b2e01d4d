package announce

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
)

// strangerEnv tells a re-executed test binary, run as nobody, what to do:
// "squat:<role id>" or "connect:<name>".
const strangerEnv = "LABCLOUD_ANNOUNCE_STRANGER"

// squattedEnv names the role a re-executed TestRoleSquatted runs, inside
// the network namespace where a stranger sits on its names.
const squattedEnv = "LABCLOUD_ANNOUNCE_SQUATTED_ID"

// TestStranger is the process of another local user: it squats a role's
// names, or connects to a held name and says whether it was let in.
func TestStranger(t *testing.T) {
	what, arg, ok := strings.Cut(os.Getenv(strangerEnv), ":")
	if !ok {
		t.Skip("only run as a child process of the squatting tests")
	}
	switch what {
	case "squat":
		r := NewRole(nil, arg, nil)
		// "leader" listened on and never accepted, a look-alike of a
		// fresh name, and "host" bound without listening.
		for _, name := range []string{r.leader.base, r.leader.base + "/fake"} {
			if _, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: name, Net: "unixpacket"}); err != nil {
				t.Fatal(err)
			}
		}
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrUnix{Name: r.host.base}); err != nil {
			t.Fatal(err)
		}
		fmt.Println("holding")
		time.Sleep(time.Minute)
	case "connect":
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: arg, Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		var b [1]byte
		_, err = c.Read(b[:])
		switch {
		case errors.Is(err, io.EOF):
			fmt.Println("closed")
		case errors.Is(err, os.ErrDeadlineExceeded):
			fmt.Println("open")
		default:
			t.Fatal(err)
		}
	}
}

// strangerBinary is this test binary copied where nobody may run it.
func strangerBinary(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Fatalf("setpriv (util-linux) is needed to run a process as another user: %v", err)
	}
	dir, err := os.MkdirTemp("", "announce-stranger-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "announce.test")
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// stranger returns the command running bin's TestStranger as nobody.
func stranger(bin, task string, prefix ...string) *exec.Cmd {
	argv := append(prefix, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
		bin, "-test.run=^TestStranger$", "-test.count=1")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), strangerEnv+"="+task)
	cmd.Dir = filepath.Dir(bin)
	return cmd
}

// TestNameLockDropsStrangers: a connection from another user to a held
// name is closed at once and wakes no one; one of ours is kept.
func TestNameLockDropsStrangers(t *testing.T) {
	requireRoot(t)
	bin := strangerBinary(t)
	name := fmt.Sprintf("@labcloud/announce/test-%d/host", time.Now().UnixNano())
	var woken atomic.Int32
	lock, err := claim(logr.Discard(), name, func() { woken.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer lock.release()

	out, err := stranger(bin, "connect:"+name).CombinedOutput()
	if err != nil {
		t.Fatalf("stranger: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "closed") {
		t.Fatalf("another user's connection was kept open:\n%s", out)
	}
	if n := woken.Load(); n != 0 {
		t.Fatalf("another user's connection woke the holder %d times", n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gone := watch(ctx, name)
	if gone == nil {
		t.Fatal("a process of ours cannot watch the name")
	}
	if _, ok := waitFor(time.Second, func() bool { return woken.Load() == 1 }); !ok {
		t.Fatal("a connection of ours did not wake the holder")
	}
	select {
	case <-gone:
		t.Fatal("the holder closed a connection of ours")
	case <-time.After(100 * time.Millisecond):
	}
	lock.release()
	select {
	case <-gone:
	case <-time.After(time.Second):
		t.Fatal("the watch did not end when the name was released")
	}
}

// TestRoleSquatted: another user on the host sits on the role's names in
// the bridge's network namespace (as in the unit's sandbox). A stand-in
// still answers, Lead does not block, the squatter is reported, and of
// several replicas only one ever leads.
func TestRoleSquatted(t *testing.T) {
	if id := os.Getenv(squattedEnv); id != "" {
		squattedRoles(t, id)
		return
	}
	sandbox, ns := sandboxNetns(t, "lc-squat")
	bin := strangerBinary(t)
	run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	id := "br-squat"
	squatter := stranger(bin, "squat:"+id, "ip", "netns", "exec", ns)
	squatter.Stderr = os.Stderr
	startHolding(t, squatter)

	argv := sandbox.Wrap([]string{os.Args[0], "-test.run=^TestRoleSquatted$", "-test.count=1", "-test.v"})
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Env = append(os.Environ(), squattedEnv+"="+id)
	got, err := cmd.CombinedOutput()
	t.Logf("replicas beside the squatter:\n%s", got)
	if err != nil {
		t.Fatalf("the replicas failed beside the squatter: %v", err)
	}
	if !strings.Contains(string(got), "A process not ours holds a name") || !strings.Contains(string(got), "uid=65534") {
		t.Fatal("the squatter was not reported")
	}
}

// squattedRoles is TestRoleSquatted's half in the namespace.
func squattedRoles(t *testing.T, id string) {
	fa, fb := onOneHost(t, node1MAC)
	ctx := testContext(t)
	ra, rb := NewRole(fa.a, id, everyVIP), NewRole(fb.a, id, everyVIP)
	ra.poll, rb.poll = 10*time.Millisecond, 10*time.Millisecond
	ra.Stand(ctx)
	rb.Stand(ctx)
	fa.run()
	fb.run()
	standing := func() int {
		n := 0
		for _, f := range []*fixture{fa, fb} {
			if f.a.handover.active() {
				n++
			}
		}
		return n
	}
	if _, ok := waitFor(2*time.Second, func() bool { return standing() > 0 }); !ok {
		t.Fatal("no stand-in answers while a stranger sits on the names")
	}
	time.Sleep(100 * time.Millisecond)
	if n := standing(); n != 1 {
		t.Fatalf("%d stand-ins answer", n)
	}

	leadCtx, die := context.WithCancel(ctx)
	led := make(chan error, 1)
	go func() { led <- ra.Lead(leadCtx) }()
	select {
	case err := <-led:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Lead is blocked by a stranger's socket")
	}
	if fb.a.handover.active() {
		t.Fatal("the other replica still stands in while one leads")
	}
	if got := fa.answer(wait); got != node1MAC.String() {
		t.Fatalf("the leader answered %q, want the recorded %s", got, node1MAC)
	}
	waitCtx, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	if err := rb.Lead(waitCtx); err == nil {
		t.Fatal("a second replica leads beside the first")
	}
	die()
	leadCtx, die = context.WithCancel(ctx)
	if err := rb.Lead(leadCtx); err != nil {
		t.Fatal(err)
	}
	if fa.a.handover.active() || !fb.a.handover.active() {
		t.Fatal("the second replica does not answer alone after the first let go")
	}
	die()
	leadInTurn(t, id, 4)
}

// TestRoleLeadersInTurn: replicas that all try to lead at once lead one
// at a time.
func TestRoleLeadersInTurn(t *testing.T) {
	leadInTurn(t, fmt.Sprintf("test-%d", time.Now().UnixNano()), 4)
}

// leadInTurn starts n replicas' Lead at once and lets each leader go in
// turn: exactly one leads, and answers, at any time.
func leadInTurn(t *testing.T, id string, n int) {
	t.Helper()
	ctx := testContext(t)
	type replica struct {
		f    *fixture
		stop context.CancelFunc
	}
	rs := make([]replica, n)
	led := make(chan int, n)
	for i := range rs {
		rs[i].f = newFixture(t, testOptions())
		rs[i].f.a.neigh = rs[0].f.a.neigh
		r := NewRole(rs[i].f.a, id, everyVIP)
		lctx, stop := context.WithCancel(ctx)
		rs[i].stop = stop
		r.Stand(lctx)
		go func() {
			if r.Lead(lctx) == nil {
				led <- i
			}
		}()
	}
	for range n {
		var i int
		select {
		case i = <-led:
		case <-time.After(2 * time.Second):
			t.Fatal("no replica leads")
		}
		select {
		case j := <-led:
			t.Fatalf("replicas %d and %d lead at once", i, j)
		case <-time.After(100 * time.Millisecond):
		}
		active := 0
		for _, r := range rs {
			if r.f.a.handover.active() {
				active++
			}
		}
		if active != 1 || !rs[i].f.a.handover.active() {
			t.Fatalf("%d replicas answer, want only the leader %d", active, i)
		}
		rs[i].stop()
	}
}
