package libvirtcloud

import (
	"context"
	"time"

	"github.com/go-logr/logr"
)

// Reconnection backoff. The first attempt after losing a connection that
// had served for stableAfter is immediate: a VIP's failover may wait on
// the events it brings. Each failure after that (no connection, or one
// lost before stableAfter, as when the first listing fails) doubles the
// wait up to reconnectCap, so a hypervisor that keeps failing is not
// retried in a tight loop.
const (
	reconnectBase = 250 * time.Millisecond
	reconnectCap  = 15 * time.Second
	stableAfter   = time.Minute
)

// reconnectDelay is the wait before the next attempt after failures
// failed attempts in a row. r, in [0, 1), takes up to half the wait off,
// so that hypervisors failing together do not retry in step.
func reconnectDelay(failures int, r float64) time.Duration {
	if failures <= 0 {
		return 0
	}
	d := reconnectCap
	if failures <= 16 { // beyond, the shift overflows; the cap holds anyway
		d = min(d, reconnectBase<<(failures-1))
	}
	return d - time.Duration(r*float64(d)/2)
}

// backoff counts failed attempts in a row.
type backoff struct {
	failures int
	rand     func() float64 // in [0, 1)
}

// next is the wait before the next attempt, given how long the last
// connection served (zero if none was made).
func (b *backoff) next(served time.Duration) time.Duration {
	if served >= stableAfter {
		b.failures = 0
	} else {
		b.failures++
	}
	return reconnectDelay(b.failures, b.rand())
}

// attempt is what one connection attempt came to.
type attempt struct {
	connected bool
	served    time.Duration // how long the connection served
	err       error         // why it failed or was lost; nil when ctx ended
}

// reconnect makes attempts until ctx ends, waiting between them as b
// says; after is time.After, or a fake one in tests.
func reconnect(ctx context.Context, log logr.Logger, b *backoff, after func(time.Duration) <-chan time.Time, try func(context.Context) attempt) {
	delay := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-after(delay):
		}
		// select picks at random among ready cases.
		if ctx.Err() != nil {
			return
		}
		a := try(ctx)
		if ctx.Err() != nil {
			return
		}
		delay = b.next(a.served)
		if a.connected {
			log.Error(a.err, "Lost hypervisor connection; reconnecting", "in", delay)
		} else {
			log.Error(a.err, "Cannot connect to hypervisor; retrying", "in", delay)
		}
	}
}
