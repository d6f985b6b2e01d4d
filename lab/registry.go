package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"runtime"

	"github.com/vishvananda/netns"

	"github.com/labcloud/labcloud/lab/imageload"
)

// The lab's registry (lab/registry) serves what `labcloud load` pushed to
// every node: read-only on the bridge's addresses, which each node's
// containerd uses as a mirror for every name, and read-write on the lab
// namespace's loopback only, which nothing but root on the host (entering
// the namespace) reaches. One copy for every node, present and future: a
// node started or restarted later pulls from it as the first did.
const (
	RegistryPort = 5000
	// RegistryPushAddr is where labcloud load pushes, in the lab's namespace.
	RegistryPushAddr = "127.0.0.1:5000"
)

// RegistryAddr is the registry as the nodes reach it: the bridge's address
// of the cluster's primary family, as the API server's.
func (a Addresses) RegistryAddr() string {
	return netip.AddrPortFrom(netip.MustParseAddr(a.apiAddress), RegistryPort).String()
}

// LoadImages loads images into the lab's registry (imageload.Load), from
// this (the host's) namespace: the push address is on the lab's loopback,
// dialled from a thread that enters the lab's namespace for the dial only.
func LoadImages(ctx context.Context, st *State, opts imageload.Options) error {
	if st.Light {
		return errors.New("a light lab has no nodes to run images: labcloud load needs a full lab (labcloud up without --light)")
	}
	if st.Pids[RegistryPid] == 0 {
		return errors.New("this lab has no registry (it was brought up by a labcloud without load): run labcloud down, then up")
	}
	opts.Registry, opts.Transport = RegistryPushAddr, &http.Transport{DialContext: dialInNetns(st.Netns)}
	return imageload.Load(ctx, opts)
}

// dialInNetns dials in the named network namespace, on a thread that
// enters it and is never used again: its goroutine exits still locked to
// it, so the runtime ends the thread and nothing else runs in the lab's
// namespace. The socket stays there.
func dialInNetns(name string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type dialed struct {
			c   net.Conn
			err error
		}
		ch := make(chan dialed, 1)
		go func() {
			runtime.LockOSThread() // never unlocked, see above
			ns, err := netns.GetFromName(name)
			if err != nil {
				ch <- dialed{nil, fmt.Errorf("the lab's network namespace %s: %w", name, err)}
				return
			}
			defer ns.Close()
			if err := netns.Set(ns); err != nil {
				ch <- dialed{nil, fmt.Errorf("enter the lab's network namespace %s: %w", name, err)}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			ch <- dialed{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}
