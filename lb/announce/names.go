package announce

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// names is one of Role's locks ("leader" or "host"): a family of abstract
// names, base and base + "/" + a random token. Any local user can bind any
// abstract name, so holding one proves nothing by itself; the lock rests
// on the kernel's word on who owns each listening socket (named):
//
//   - a process of ours takes the lock by listening on a name of the
//     family (base if it can bind it, else a fresh token name), and uses
//     it only if, listing the family after that, it finds no other process
//     of ours there. Of two that take names at once, the later to list
//     sees the other, so two never both hold the lock; one that sees
//     another lets go, and retries after a random pause in case both saw
//     each other.
//   - sockets of anyone else in the family are reported and passed over:
//     they can neither keep us from the lock nor pass for a holder.
//
// The kernel pages a listing, so someone closing sockets in a holder's
// hash bucket at the wrong moment can hide it from one listing; a taker
// would have to miss it twice in a row.
//
// Older versions know only base: while someone not ours sits on it, they
// wait for it as before.
type names struct {
	base   string
	onConn func() // for each connection of ours to a held name

	mu        sync.Mutex
	gone      <-chan struct{} // the stand-in's open watch of a holder
	squatters map[uint32]bool // the sockets of others reported already
	lastErr   string          // the listing error logged last
}

func newNames(base string, onConn func()) *names {
	return &names{base: base, onConn: onConn}
}

// heldError says that another process of ours holds the lock.
type heldError struct {
	name string
	// contended: this process had taken a name too, and let it go.
	contended bool
}

func (e *heldError) Error() string { return e.name + " is held by another process of ours" }

// try takes the lock unless another process of ours holds it (an error
// wrapping *heldError then).
func (n *names) try(ctx context.Context) (*nameLock, error) {
	ls, err := n.list(ctx)
	if err != nil {
		return nil, err
	}
	if h, ok := holder(ls, ""); ok {
		return nil, &heldError{name: h}
	}
	lock, err := n.claim(ctx)
	if err != nil {
		return nil, err
	}
	if ls, err = n.list(ctx); err != nil {
		lock.release()
		return nil, err
	}
	if h, ok := holder(ls, lock.name); ok {
		lock.release()
		return nil, &heldError{name: h, contended: true}
	}
	return lock, nil
}

// claim binds base, or a fresh name of the family if base is taken (by
// someone not ours, or by one of ours a moment ago: the listing after
// the claim settles that).
func (n *names) claim(ctx context.Context) (*nameLock, error) {
	log := klog.FromContext(ctx)
	name := n.base
	for i := 0; ; i++ {
		lock, err := claim(log, name, n.onConn)
		if err == nil {
			return lock, nil
		}
		if !errors.Is(err, unix.EADDRINUSE) || i == 3 {
			return nil, fmt.Errorf("claiming %s: %w", name, err)
		}
		name = n.base + "/" + rand.Text()
	}
}

// holder is a name of the family another process of ours listens on.
func holder(ls []bound, mine string) (string, bool) {
	for _, l := range ls {
		if l.holds() && l.name != mine {
			return l.name, true
		}
	}
	return "", false
}

// list lists the family's sockets and reports those not ours.
func (n *names) list(ctx context.Context) ([]bound, error) {
	ls, err := named(n.base)
	if err != nil {
		return nil, err
	}
	seen := map[uint32]bool{}
	var fresh []bound
	n.mu.Lock()
	for _, l := range ls {
		if !trusted(l.uid) {
			seen[l.ino] = true
			if !n.squatters[l.ino] {
				fresh = append(fresh, l)
			}
		}
	}
	n.squatters, n.lastErr = seen, ""
	n.mu.Unlock()
	if len(fresh) > 0 {
		l := fresh[0]
		kv := []any{"name", l.name, "uid", l.uid, "sockets", len(fresh)}
		if c, cred, err := dial(l.name); err == nil {
			c.Close()
			kv = append(kv, "pid", cred.Pid)
		}
		klog.FromContext(ctx).Error(nil, "A process not ours holds a name of the host's announcer lock; passing over it", kv...)
	}
	return ls, nil
}

// fail logs a listing error unless it is the one logged last.
func (n *names) fail(ctx context.Context, err error) {
	n.mu.Lock()
	same := n.lastErr == err.Error()
	n.lastErr = err.Error()
	n.mu.Unlock()
	if !same {
		klog.FromContext(ctx).Error(err, "Cannot tell who holds the host's announcer lock; not answering meanwhile", "name", n.base)
	}
}

// watch says whether another process of ours holds the lock and if so
// returns a channel closed when it lets go (nil if it cannot be watched:
// poll then). It keeps one watch open while that holder lives. A lock
// whose holders cannot be listed counts as free: taking it needs a
// listing too, and keeping it is safe.
func (n *names) watch(ctx context.Context) (<-chan struct{}, bool) {
	n.mu.Lock()
	g := n.gone
	n.mu.Unlock()
	if g != nil {
		select {
		case <-g:
		default:
			return g, true
		}
	}
	ls, err := n.list(ctx)
	if err != nil {
		n.fail(ctx, err)
		return nil, false
	}
	h, held := holder(ls, "")
	g = nil
	if held {
		g = watch(ctx, h)
	}
	n.mu.Lock()
	n.gone = g
	n.mu.Unlock()
	return g, held
}

// await takes the lock, waiting until ctx ends for the process of ours
// that holds it to let go. It retries other failures, logged: a replica
// that is to lead must not give up while it may still lead.
func (n *names) await(ctx context.Context) (*nameLock, error) {
	backoff := 100 * time.Millisecond
	for {
		lock, err := n.try(ctx)
		if err == nil {
			return lock, nil
		}
		wctx, cancel := context.WithCancel(ctx)
		var gone <-chan struct{}
		var retry <-chan time.Time
		var held *heldError
		switch {
		case !errors.As(err, &held):
			n.fail(ctx, err)
			retry = time.After(backoff)
			backoff = min(2*backoff, 5*time.Second)
		case held.contended:
			retry = time.After(time.Duration(1+mrand.IntN(10)) * time.Millisecond)
		default:
			if gone = watch(wctx, held.name); gone == nil {
				retry = time.After(20 * time.Millisecond)
			}
		}
		select {
		case <-ctx.Done():
			cancel()
			return nil, fmt.Errorf("waiting for %s: %w", n.base, ctx.Err())
		case <-gone:
		case <-retry:
		}
		cancel()
	}
}
