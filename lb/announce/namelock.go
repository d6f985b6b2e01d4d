package announce

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// nameLock holds an abstract name with a listening socket. It keeps every
// connection made to it open until the peer closes it or the name is
// released, so that a connected peer learns of the release (or of this
// process's death) at once, by end of file.
type nameLock struct {
	ln *net.UnixListener

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// claim takes name; an error wrapping unix.EADDRINUSE if someone holds it.
// onConn, if not nil, is called for each connection made to it.
func claim(name string, onConn func()) (*nameLock, error) {
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: name, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	n := &nameLock{ln: ln, conns: map[net.Conn]struct{}{}}
	go n.serve(onConn)
	return n, nil
}

func (n *nameLock) serve(onConn func()) {
	for {
		c, err := n.ln.Accept()
		if err != nil {
			return // released
		}
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			c.Close()
			return
		}
		n.conns[c] = struct{}{}
		n.mu.Unlock()
		if onConn != nil {
			onConn()
		}
		go func() {
			var b [1]byte
			for {
				if _, err := c.Read(b[:]); err != nil {
					break
				}
			}
			n.mu.Lock()
			delete(n.conns, c)
			n.mu.Unlock()
			c.Close()
		}()
	}
}

// release frees the name and ends every connection to it.
func (n *nameLock) release() {
	n.mu.Lock()
	n.closed = true
	conns := n.conns
	n.conns = nil
	n.mu.Unlock()
	n.ln.Close()
	for c := range conns {
		c.Close()
	}
}

// watch reports whether someone holds name and, if so, returns a channel
// closed the moment they let go of it (or ctx ends). The channel is nil
// (never ready) if the name cannot be watched, e.g. one held by an
// older version's plain socket: callers poll then.
func watch(ctx context.Context, name string) (<-chan struct{}, bool) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: name, Net: "unixpacket"})
	if err != nil {
		return nil, !errors.Is(err, unix.ECONNREFUSED) && !errors.Is(err, unix.ENOENT)
	}
	gone := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { c.Close() })
	go func() {
		defer close(gone)
		defer stop()
		defer c.Close()
		var b [1]byte
		for {
			if _, err := c.Read(b[:]); err != nil {
				return
			}
		}
	}()
	return gone, true
}

// await claims name, waiting until ctx ends for whoever holds it to let go.
func await(ctx context.Context, name string, onConn func()) (*nameLock, error) {
	for {
		n, err := claim(name, onConn)
		if err == nil {
			return n, nil
		}
		if !errors.Is(err, unix.EADDRINUSE) {
			return nil, fmt.Errorf("claiming %s: %w", name, err)
		}
		wctx, cancel := context.WithCancel(ctx)
		gone, held := watch(wctx, name)
		var retry <-chan time.Time
		if !held || gone == nil {
			// Between the other side's bind and listen, or not watchable.
			retry = time.After(5 * time.Millisecond)
		}
		select {
		case <-ctx.Done():
			cancel()
			return nil, fmt.Errorf("waiting for %s: %w", name, ctx.Err())
		case <-gone:
		case <-retry:
		}
		cancel()
	}
}
