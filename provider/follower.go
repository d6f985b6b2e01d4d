package provider

import (
	"context"
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"
)

// follower is a loop that a replica which does not lead runs for its own
// host (its routes, its answers) until it leads: Cloud.Initialize halts
// it, so that the leader's controllers take over as the one writer.
type follower struct {
	stop context.CancelFunc
	done chan struct{}
}

// startFollower runs, until halted or ctx ends: prepare once (false: stop
// there), then step, again on each receive from changed and when the wait
// step returns is over. cleanup runs last.
func startFollower(ctx context.Context, changed <-chan struct{}, prepare func(context.Context) bool, step func(context.Context) time.Duration, cleanup func()) *follower {
	ctx, stop := context.WithCancel(ctx)
	f := &follower{stop: stop, done: make(chan struct{})}
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

// halt stops the follower and waits until its last write is done.
func (f *follower) halt() {
	f.stop()
	<-f.done
}

// kicker is a pending-work flag: kicks coalesce into one receive.
type kicker chan struct{}

func newKicker() kicker { return make(kicker, 1) }

func (k kicker) kick() {
	select {
	case k <- struct{}{}:
	default:
	}
}

// onAnyChange calls f on every add, update and delete the informer sees.
func onAnyChange(informer cache.SharedIndexInformer, f func()) (cache.ResourceEventHandlerRegistration, error) {
	return informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { f() },
		UpdateFunc: func(any, any) { f() },
		DeleteFunc: func(any) { f() },
	})
}

// onDomainEvents calls f on each of src's domain events, from a goroutine
// of wg, until ctx ends or src closes the stream.
func onDomainEvents(ctx context.Context, wg *sync.WaitGroup, src DomainEvents, f func()) {
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
