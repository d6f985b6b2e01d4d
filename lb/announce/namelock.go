package announce

import (
	"context"
	"net"
	"sync"

	"github.com/go-logr/logr"
)

// nameLock holds an abstract name with a listening socket. It keeps every
// connection a process of ours makes to it open until the peer closes it
// or the name is released, so that a connected peer learns of the release
// (or of this process's death) at once, by end of file. Connections from
// anyone else are closed at once and wake no one.
type nameLock struct {
	name string
	ln   *net.UnixListener

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// claim takes name; an error wrapping unix.EADDRINUSE if someone holds it.
// onConn, if not nil, is called for each connection a process of ours
// makes to it.
func claim(log logr.Logger, name string, onConn func()) (*nameLock, error) {
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: name, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	n := &nameLock{name: name, ln: ln, conns: map[net.Conn]struct{}{}}
	go n.serve(log, onConn)
	return n, nil
}

func (n *nameLock) serve(log logr.Logger, onConn func()) {
	for {
		c, err := n.ln.AcceptUnix()
		if err != nil {
			return // released
		}
		if cred, err := peerCred(c); err != nil || !trusted(cred.Uid) {
			if err == nil {
				log.V(2).Info("Closed a connection from a process not ours", "name", n.name, "pid", cred.Pid, "uid", cred.Uid)
			}
			c.Close()
			continue
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

// watch connects to the process of ours listening on name and returns a
// channel closed the moment it lets go of the name (or ctx ends); nil if
// no process of ours listens there (any more), or it cannot be reached:
// callers poll then.
func watch(ctx context.Context, name string) <-chan struct{} {
	c, cred, err := dial(name)
	if err != nil {
		return nil
	}
	if !trusted(cred.Uid) {
		c.Close()
		return nil
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
	return gone
}
