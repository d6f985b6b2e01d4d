package libvirtcloud

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

func TestReconnectDelay(t *testing.T) {
	for _, tt := range []struct {
		failures int
		r        float64
		want     time.Duration
	}{
		{0, 0, 0},
		{0, 0.9, 0},
		{1, 0, 250 * time.Millisecond},
		{1, 0.5, 187500 * time.Microsecond},
		{2, 0, 500 * time.Millisecond},
		{3, 0, time.Second},
		{6, 0, 8 * time.Second},
		{7, 0, 15 * time.Second}, // capped
		{7, 0.999, 7507500 * time.Microsecond},
		{16, 0, 15 * time.Second},
		{17, 0, 15 * time.Second}, // past the shift's range
		{1000, 0, 15 * time.Second},
	} {
		if got := reconnectDelay(tt.failures, tt.r); got != tt.want {
			t.Errorf("reconnectDelay(%d, %v) = %v, want %v", tt.failures, tt.r, got, tt.want)
		}
	}
}

// A connection must serve a while to reset the backoff: one lost at once
// (its first listing failed) counts as a failure like no connection.
func TestBackoffNext(t *testing.T) {
	b := &backoff{rand: func() float64 { return 0 }}
	for i, tt := range []struct {
		served time.Duration
		want   time.Duration
	}{
		{0, 250 * time.Millisecond},
		{0, 500 * time.Millisecond},
		{time.Millisecond, time.Second},
		{stableAfter - time.Second, 2 * time.Second},
		{stableAfter, 0}, // the first retry after a good connection is at once
		{0, 250 * time.Millisecond},
		{time.Hour, 0},
	} {
		if got := b.next(tt.served); got != tt.want {
			t.Errorf("step %d: next(%v) = %v, want %v", i, tt.served, got, tt.want)
		}
	}
}

// waits records the waits asked for, lets them pass at once, and ends
// the loop (cancel) after n of them.
type waits struct {
	n      int
	cancel context.CancelFunc
	got    []time.Duration
}

func (w *waits) after(d time.Duration) <-chan time.Time {
	w.got = append(w.got, d)
	if len(w.got) > w.n {
		w.cancel()
	}
	ch := make(chan time.Time, 1)
	ch <- time.Time{}
	return ch
}

// Connections that are lost at once are retried after growing waits, not
// in a tight loop; one that served a while is retried at once.
func TestReconnectBacksOffWhenConnectionsFailFast(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &waits{n: 10, cancel: cancel}
	tries := 0
	reconnect(ctx, logr.Discard(), &backoff{rand: func() float64 { return 0 }}, w.after, func(context.Context) attempt {
		tries++
		if tries == 8 {
			return attempt{connected: true, served: 2 * stableAfter, err: errors.New("lost")}
		}
		return attempt{connected: true, served: time.Millisecond, err: errors.New("first listing failed")}
	})
	want := []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second,
		4 * time.Second, 8 * time.Second, 15 * time.Second, 0, 250 * time.Millisecond, 500 * time.Millisecond}
	if len(w.got) != len(want) {
		t.Fatalf("waits %v, want %v", w.got, want)
	}
	for i := range want {
		if w.got[i] != want[i] {
			t.Fatalf("waits %v, want %v", w.got, want)
		}
	}
}

// A hypervisor that cannot be reached is retried with growing, jittered
// waits up to the cap, one connection attempt per wait.
func TestUnreachableHypervisorRetriesBackOff(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := newHypervisor(ctx, Options{URI: "qemu+unix:///system?socket=" + filepath.Join(t.TempDir(), "no-libvirtd"), Zone: "down"})
	w := &waits{n: 12, cancel: cancel}
	h.after = w.after
	h.run(ctx) // returns when w has recorded its waits
	if h.Calls() != uint64(w.n) {
		t.Errorf("%d libvirt calls for %d attempts, want one Connect each", h.Calls(), w.n)
	}
	if w.got[0] != 0 {
		t.Errorf("first attempt waited %v, want none", w.got[0])
	}
	for i, d := range w.got[1:] {
		nominal := reconnectDelay(i+1, 0)
		if d > nominal || d < nominal/2 {
			t.Errorf("wait %d: %v, want within [%v, %v]", i+1, d, nominal/2, nominal)
		}
	}
}
