package tapwatch

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/labcloud/labcloud/internal/nstest"
)

// recorder keeps what it is told, as "gone vnet0" and "back vnet0".
type recorder struct {
	mu   sync.Mutex
	seen []string
	at   map[string]time.Time // first "gone" of each port
}

func (r *recorder) TapGone(dev string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, "gone "+dev)
	if _, ok := r.at[dev]; !ok {
		r.at[dev] = at
	}
}

func (r *recorder) TapBack(dev string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, "back "+dev)
}

func (r *recorder) wait(t *testing.T, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		ok := slices.Contains(r.seen, what)
		r.mu.Unlock()
		if ok {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("never told %q; told %v", what, r.told())
}

func (r *recorder) told() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

// tap makes a tap on br whose life is its file descriptors, as QEMU's is:
// closing them deletes it.
func tap(t *testing.T, nl *netlink.Handle, name string, br netlink.Link) (fds []*os.File) {
	t.Helper()
	l := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: name}, Mode: netlink.TUNTAP_MODE_TAP, NonPersist: true, Queues: 1}
	if err := nl.LinkAdd(l); err != nil {
		t.Fatalf("tap %s: %v", name, err)
	}
	if br != nil {
		if err := nl.LinkSetMaster(l, br); err != nil {
			t.Fatal(err)
		}
	}
	if err := nl.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	return l.Fds
}

// A guest's tap on a bridge, in a namespace the test makes: its deletion
// (its last descriptor closed, as when QEMU dies), its release from the
// bridge and its loss of carrier are each told once, and a tap back on a
// bridge is told back; ports of no bridge are never told.
func TestWatchTellsTapsLeavingTheBridge(t *testing.T) {
	nstest.InNew(t, func(netns.NsHandle) {
		nl, err := netlink.NewHandle()
		if err != nil {
			t.Fatal(err)
		}
		defer nl.Close()
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
		if err := nl.LinkAdd(br); err != nil {
			t.Fatal(err)
		}
		if err := nl.LinkSetUp(br); err != nil {
			t.Fatal(err)
		}
		qemu := tap(t, nl, "vnet0", br)
		released := tap(t, nl, "vnet1", br)
		defer closeAll(released)
		loose := tap(t, nl, "loose0", nil) // on no bridge
		r := &recorder{at: map[string]time.Time{}}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if err := Watch(ctx, r); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // the listing is read

		closed := time.Now()
		closeAll(qemu)
		r.wait(t, "gone vnet0")
		t.Logf("vnet0's descriptors closed → told gone after %s", r.at["vnet0"].Sub(closed).Round(time.Microsecond))

		vnet1, err := nl.LinkByName("vnet1")
		if err != nil {
			t.Fatal(err)
		}
		if err := nl.LinkSetNoMaster(vnet1); err != nil {
			t.Fatal(err)
		}
		r.wait(t, "gone vnet1")
		if err := nl.LinkSetMaster(vnet1, br); err != nil {
			t.Fatal(err)
		}
		r.wait(t, "back vnet1")
		if err := nl.LinkSetDown(vnet1); err != nil {
			t.Fatal(err)
		}
		r.wait(t, "back vnet1") // already there; what follows is a second gone
		deadline := time.Now().Add(5 * time.Second)
		for n := 0; n < 2 && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			n = count(r.told(), "gone vnet1")
		}
		closeAll(loose)
		time.Sleep(200 * time.Millisecond)

		want := []string{"gone vnet0", "gone vnet1", "back vnet1", "gone vnet1"}
		if got := r.told(); !slices.Equal(got, want) {
			t.Errorf("told %v, want %v (loose0, on no bridge, never)", got, want)
		}
	})
}

func closeAll(fds []*os.File) {
	for _, f := range fds {
		f.Close()
	}
}

func count(s []string, v string) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}
