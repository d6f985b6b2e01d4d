// Package linkwatch keeps an rtnetlink link subscription alive: the kernel
// drops messages when the socket overflows and the subscription then ends,
// so whoever follows links must subscribe again and assume it missed some.
package linkwatch

import (
	"context"
	"time"

	"github.com/vishvananda/netlink"
	"k8s.io/klog/v2"
)

// Subscribe opens a subscription that sends to updates until done is
// closed (netlink.LinkSubscribeWithOptions, in the namespace it wants).
type Subscribe func(updates chan netlink.LinkUpdate, done chan struct{}) error

// Handlers are told what the subscription brings, all from one goroutine.
type Handlers struct {
	// Update is each link message.
	Update func(netlink.LinkUpdate)
	// Resubscribed: the subscription broke and was opened again; messages
	// may have been missed.
	Resubscribed func()
	// Ended: ctx ended; nothing more is told.
	Ended func()
}

// Follow subscribes and tells h of every update until ctx ends, subscribing
// again (once a second until it works) whenever the subscription ends. It
// returns the first subscription's error.
func Follow(ctx context.Context, name string, subscribe Subscribe, h Handlers) error {
	updates, done, err := open(subscribe)
	if err != nil {
		return err
	}
	go func() {
		if h.Ended != nil {
			defer h.Ended()
		}
		log := klog.FromContext(ctx)
		for {
			select {
			case <-ctx.Done():
				close(done)
				for range updates {
					// The subscription's goroutine closes updates once it stops.
				}
				return
			case u, ok := <-updates:
				if !ok {
					close(done)
					log.Info("Link subscription ended; subscribing again", "for", name)
					if updates, done = reopen(ctx, name, subscribe); updates == nil {
						return
					}
					if h.Resubscribed != nil {
						h.Resubscribed()
					}
					continue
				}
				h.Update(u)
			}
		}
	}()
	return nil
}

func open(subscribe Subscribe) (chan netlink.LinkUpdate, chan struct{}, error) {
	updates := make(chan netlink.LinkUpdate, 256)
	done := make(chan struct{})
	if err := subscribe(updates, done); err != nil {
		close(done)
		return nil, nil, err
	}
	return updates, done, nil
}

// reopen subscribes again, once a second until it works or ctx is done
// (then it returns nils).
func reopen(ctx context.Context, name string, subscribe Subscribe) (chan netlink.LinkUpdate, chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(time.Second):
		}
		updates, done, err := open(subscribe)
		if err == nil {
			return updates, done
		}
		klog.FromContext(ctx).Error(err, "Subscribing to link updates", "for", name)
	}
}
