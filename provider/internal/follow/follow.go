// Package follow holds the loops of a CCM replica that does not lead: it
// keeps its own host (its routes, its answers) as the leader would, until
// it leads and the leader's controllers take over as the one writer. The
// leader's placement reuses its event plumbing.
package follow

import (
	"context"
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"

	"github.com/labcloud/labcloud/libvirtcloud"
)

// Follower is a loop that a replica which does not lead runs for its own
// host until it leads: whoever starts leading halts it first.
type Follower struct {
	stop context.CancelFunc
	done chan struct{}
}

// Start runs, until halted or ctx ends: prepare once (false: stop there),
// then step, again on each receive from changed and when the wait step
// returns is over. cleanup runs last.
func Start(ctx context.Context, changed <-chan struct{}, prepare func(context.Context) bool, step func(context.Context) time.Duration, cleanup func()) *Follower {
	ctx, stop := context.WithCancel(ctx)
	f := &Follower{stop: stop, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		defer cleanup()
		if !prepare(ctx) {
			return
		}
		for {
			next := step(ctx)
			select {
			case <-ctx.Done():
				return
			case <-changed:
			case <-time.After(next):
			}
		}
	}()
	return f
}

// Halt stops the follower and waits until its last write is done.
func (f *Follower) Halt() {
	f.stop()
	<-f.done
}

// Kicker is a pending-work flag: kicks coalesce into one receive.
type Kicker chan struct{}

// NewKicker returns a Kicker with no work pending.
func NewKicker() Kicker { return make(Kicker, 1) }

// Kick marks work pending.
func (k Kicker) Kick() {
	select {
	case k <- struct{}{}:
	default:
	}
}

// OnAnyChange calls f on every add, update and delete the informer sees.
func OnAnyChange(informer cache.SharedIndexInformer, f func()) (cache.ResourceEventHandlerRegistration, error) {
	return informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { f() },
		UpdateFunc: func(any, any) { f() },
		DeleteFunc: func(any) { f() },
	})
}

// DomainEvents is a hypervisor's stream of domain changes.
// *libvirtcloud.Hypervisor satisfies it.
type DomainEvents interface {
	Subscribe() (<-chan libvirtcloud.Event, func())
}

var _ DomainEvents = (*libvirtcloud.Hypervisor)(nil)

// OnDomainEvents calls f on each of src's domain events, from a goroutine
// of wg, until ctx ends or src closes the stream.
func OnDomainEvents(ctx context.Context, wg *sync.WaitGroup, src DomainEvents, f func()) {
	ch, stop := src.Subscribe()
	wg.Go(func() {
		defer stop()
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-ch:
				if !ok {
					return
				}
				f()
			}
		}
	})
}
