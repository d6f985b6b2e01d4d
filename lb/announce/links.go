package announce

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// NetlinkLinks watches links with rtnetlink (LinkSubscribe).
type NetlinkLinks struct {
	// Namespace to watch in; nil means the caller's.
	Namespace *netns.NsHandle
}

var _ LinkWatcher = NetlinkLinks{}

// WatchUp implements LinkWatcher. A link is up when it is administratively up
// and its operational state is up (or unknown, for drivers that do not report
// one). If the subscription breaks (the kernel drops messages when the socket
// overflows), it subscribes again and reports the link as having come up, since
// a transition may have been missed.
func (w NetlinkLinks) WatchUp(ctx context.Context, name string) (<-chan int, error) {
	updates, done, err := w.subscribe(ctx)
	if err != nil {
		return nil, fmt.Errorf("subscribing to link updates: %w", err)
	}
	out := make(chan int, 1)
	signal := func(index int) {
		select {
		case out <- index:
		default:
			// Replace a pending, older index with this one.
			select {
			case <-out:
			default:
			}
			select {
			case out <- index:
			default:
			}
		}
	}
	go func() {
		defer close(out)
		logger := klog.FromContext(ctx)
		known, up, index, missed := false, false, 0, false
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
					logger.Info("Link subscription ended; subscribing again")
					if updates, done = w.resubscribe(ctx); updates == nil {
						return
					}
					known, missed = false, true
					continue
				}
				if u.Link == nil || u.Link.Attrs().Name != name {
					continue
				}
				now := linkUp(u)
				if now && (missed || known && (!up || u.Link.Attrs().Index != index)) {
					signal(u.Link.Attrs().Index)
				}
				known, up, index, missed = true, now, u.Link.Attrs().Index, false
			}
		}
	}()
	return out, nil
}

// resubscribe subscribes again, once a second until it works or ctx is done
// (then it returns nils).
func (w NetlinkLinks) resubscribe(ctx context.Context) (chan netlink.LinkUpdate, chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(time.Second):
		}
		updates, done, err := w.subscribe(ctx)
		if err == nil {
			return updates, done
		}
		klog.FromContext(ctx).Error(err, "Subscribing to link updates")
	}
}

func (w NetlinkLinks) subscribe(ctx context.Context) (chan netlink.LinkUpdate, chan struct{}, error) {
	logger := klog.FromContext(ctx)
	updates := make(chan netlink.LinkUpdate, 16)
	done := make(chan struct{})
	// The subscription's socket belongs to the namespace of the thread that
	// opens it; netlink's own Namespace option would enter the namespace
	// even when the thread is already in it, which needs CAP_SYS_ADMIN.
	subscribe := func() error {
		return netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
			ListExisting:  true,
			ErrorCallback: func(err error) { logger.V(2).Info("Link updates", "err", err) },
		})
	}
	var err error
	if w.Namespace != nil {
		err = inNamespace(*w.Namespace, subscribe)
	} else {
		err = subscribe()
	}
	if err != nil {
		close(done)
		return nil, nil, err
	}
	return updates, done, nil
}

func linkUp(u netlink.LinkUpdate) bool {
	if u.Header.Type == unix.RTM_DELLINK {
		return false
	}
	attrs := u.Link.Attrs()
	return attrs.Flags&net.FlagUp != 0 &&
		(attrs.OperState == netlink.OperUp || attrs.OperState == netlink.OperUnknown)
}
