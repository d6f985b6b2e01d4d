// Package relay joins TCP connections accepted on one socket to new ones to
// a target. The lab serves its API server on the host's loopback with it:
// a socket keeps the network namespace it was made in, so one made on the
// host and handed to a process in the lab's namespace accepts the host's
// connections while the dials to the target are made in the lab's.
package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// ListenHost opens the listening socket for the forwarder on the host's
// loopback (a free port) and returns it as a file to hand down.
func ListenHost() (*os.File, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen on the host's loopback for the API server forwarder: %w", err)
	}
	defer l.Close()
	return l.(*net.TCPListener).File()
}

// Serve accepts connections on l and joins each to a new connection to
// target, both ways, until ctx ends; then it closes l and every connection
// and returns once its goroutines have.
func Serve(ctx context.Context, l net.Listener, target string) error {
	logger := klog.FromContext(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		l.Close()
	}()
	var d net.Dialer
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("accept: %w", err)
			}
			// Out of file descriptors and the like: wait and go on.
			logger.Error(err, "Accept")
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
			up, err := d.DialContext(dctx, "tcp", target)
			dcancel()
			if err != nil {
				logger.Error(err, "Dial the target", "target", target, "client", c.RemoteAddr())
				return
			}
			defer up.Close()
			stop := context.AfterFunc(ctx, func() { c.Close(); up.Close() })
			defer stop()
			join(c, up)
		}()
	}
}

// join copies a→b and b→a; when one side ends, the other is told (half
// close) and both are done when both directions are.
func join(a, b net.Conn) {
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	wg.Add(2)
	go pipe(a, b)
	go pipe(b, a)
	wg.Wait()
}

// Addr is the local address of a listening socket file.
func Addr(f *os.File) (string, error) {
	sa, err := syscall.Getsockname(int(f.Fd()))
	if err != nil {
		return "", fmt.Errorf("host listener: %w", err)
	}
	in4, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		return "", fmt.Errorf("host listener: not an IPv4 socket (%T)", sa)
	}
	return net.JoinHostPort(net.IP(in4.Addr[:]).String(), fmt.Sprint(in4.Port)), nil
}
