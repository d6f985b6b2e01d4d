package announce

import (
	"context"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/labcloud/labcloud/internal/linkwatch"
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
	known, up, index, missed := false, false, 0, false
	err := linkwatch.Follow(ctx, "bridge "+name, w.subscribe(ctx), linkwatch.Handlers{
		Update: func(u netlink.LinkUpdate) {
			if u.Link == nil || u.Link.Attrs().Name != name {
				return
			}
			now := linkUp(u)
			if now && (missed || known && (!up || u.Link.Attrs().Index != index)) {
				signal(u.Link.Attrs().Index)
			}
			known, up, index, missed = true, now, u.Link.Attrs().Index, false
		},
		Resubscribed: func() { known, missed = false, true },
		Ended:        func() { close(out) },
	})
	if err != nil {
		return nil, fmt.Errorf("subscribing to link updates: %w", err)
	}
	return out, nil
}

// subscribe subscribes in w's namespace. The subscription's socket belongs
// to the namespace of the thread that opens it; netlink's own Namespace
// option would enter the namespace even when the thread is already in it,
// which needs CAP_SYS_ADMIN.
func (w NetlinkLinks) subscribe(ctx context.Context) linkwatch.Subscribe {
	logger := klog.FromContext(ctx)
	return func(updates chan netlink.LinkUpdate, done chan struct{}) error {
		subscribe := func() error {
			return netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
				ListExisting:  true,
				ErrorCallback: func(err error) { logger.V(2).Info("Link updates", "err", err) },
			})
		}
		if w.Namespace != nil {
			return inNamespace(*w.Namespace, subscribe)
		}
		return subscribe()
	}
}

func linkUp(u netlink.LinkUpdate) bool {
	if u.Header.Type == unix.RTM_DELLINK {
		return false
	}
	attrs := u.Link.Attrs()
	return attrs.Flags&net.FlagUp != 0 &&
		(attrs.OperState == netlink.OperUp || attrs.OperState == netlink.OperUnknown)
}
