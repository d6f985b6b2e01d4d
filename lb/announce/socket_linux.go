package announce

import (
	"errors"
	"fmt"
	"net"
	"runtime"

	"github.com/mdlayher/arp"
	"github.com/vishvananda/netns"

	"github.com/mdlayher/packet"
	"golang.org/x/sys/unix"
)

// listen opens a raw packet socket for ARP on ifi that does not see the frames
// this host sends, so the responder never hears its own announcements.
func listen(ifi *net.Interface) (net.PacketConn, error) {
	c, err := packet.Listen(ifi, packet.Raw, unix.ETH_P_ARP, nil)
	if err != nil {
		return nil, err
	}
	rc, err := c.SyscallConn()
	if err != nil {
		c.Close()
		return nil, err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1)
	}); err != nil {
		c.Close()
		return nil, err
	}
	if serr != nil {
		c.Close()
		return nil, fmt.Errorf("setting PACKET_IGNORE_OUTGOING: %w", serr)
	}
	return c, nil
}

// reopenIn returns a Reopen that finds the bridge by name in ns and opens
// a new ARP socket on it there, whatever namespace the calling thread is in.
func reopenIn(ns netns.NsHandle) Reopen {
	return func(name string) (*net.Interface, Conn, error) {
		var (
			ifi *net.Interface
			c   *arp.Client
		)
		err := inNamespace(ns, func() error {
			var err error
			if ifi, err = net.InterfaceByName(name); err != nil {
				return err
			}
			pc, err := listen(ifi)
			if err != nil {
				return fmt.Errorf("opening ARP socket on %s: %w", name, err)
			}
			if c, err = arp.New(ifi, pc); err != nil {
				pc.Close()
				return fmt.Errorf("ARP client on %s (needs an IPv4 address): %w", name, err)
			}
			return nil
		})
		if err != nil {
			return nil, nil, err
		}
		return ifi, c, nil
	}
}

// inNamespace runs fn on a thread in ns. A thread already there (every
// thread of an installed CCM) is not switched: entering a namespace takes
// CAP_SYS_ADMIN, even one's own, and the shipped unit grants only
// CAP_NET_ADMIN and CAP_NET_RAW. A thread that was switched and cannot be
// switched back stays locked and dies with its goroutine.
func inNamespace(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("current network namespace: %w", err)
	}
	defer orig.Close()
	if orig.Equal(ns) {
		defer runtime.UnlockOSThread()
		return fn()
	}
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("entering the bridge's network namespace: %w", err)
	}
	ferr := fn()
	if err := netns.Set(orig); err != nil {
		return errors.Join(ferr, fmt.Errorf("restoring the network namespace: %w", err))
	}
	runtime.UnlockOSThread()
	return ferr
}
