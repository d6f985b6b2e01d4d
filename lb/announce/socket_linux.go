package announce

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"

	"github.com/mdlayher/packet"
	"github.com/vishvananda/netns"
	"golang.org/x/net/bpf"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// open opens the ARP and neighbour-discovery sockets on ifi, and the
// socket that joins multicast groups if the host has IPv6 at all.
func open(ifi *net.Interface) (Conns, error) {
	arpc, err := listen(ifi, unix.ETH_P_ARP, nil)
	if err != nil {
		return Conns{}, fmt.Errorf("opening ARP socket on %s: %w", ifi.Name, err)
	}
	nd, err := listen(ifi, unix.ETH_P_IPV6, ndFilter)
	if err != nil {
		arpc.Close()
		return Conns{}, fmt.Errorf("opening neighbour-discovery socket on %s: %w", ifi.Name, err)
	}
	c := Conns{ARP: &arpConn{pc: arpc}, ND: nd}
	if g, err := listenGroups(ifi); err == nil {
		c.Groups = g
	}
	return c, nil
}

// ndFilter passes only ICMPv6 Neighbor Solicitations and Advertisements
// without extension headers (which neighbour discovery never carries), so
// the socket costs nothing for the rest of the bridge's IPv6 traffic.
var ndFilter = mustAssemble([]bpf.Instruction{
	bpf.LoadAbsolute{Off: 12, Size: 2},                                    // EtherType
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.ETH_P_IPV6, SkipTrue: 5}, // drop
	bpf.LoadAbsolute{Off: 14 + 6, Size: 1},                                // next header
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.IPPROTO_ICMPV6, SkipTrue: 3},
	bpf.LoadAbsolute{Off: 14 + 40, Size: 1}, // ICMPv6 type
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(ipv6.ICMPTypeNeighborSolicitation), SkipTrue: 2},
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(ipv6.ICMPTypeNeighborAdvertisement), SkipTrue: 1},
	bpf.RetConstant{Val: 0},
	bpf.RetConstant{Val: maxNDFrame},
})

func mustAssemble(prog []bpf.Instruction) []bpf.RawInstruction {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		panic(err)
	}
	return raw
}

// listen opens a raw packet socket for proto on ifi that does not see the
// frames this host sends, so the responder never hears its own frames.
func listen(ifi *net.Interface, proto int, filter []bpf.RawInstruction) (*packet.Conn, error) {
	c, err := packet.Listen(ifi, packet.Raw, proto, &packet.Config{Filter: filter})
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

// udpGroups joins groups through a UDP socket that is never read: joining
// needs no privilege, and the kernel sends the MLD reports.
type udpGroups struct {
	c   *net.UDPConn
	pc  *ipv6.PacketConn
	ifi *net.Interface
}

func listenGroups(ifi *net.Interface) (*udpGroups, error) {
	c, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6unspecified})
	if err != nil {
		return nil, err
	}
	return &udpGroups{c: c, pc: ipv6.NewPacketConn(c), ifi: ifi}, nil
}

func (g *udpGroups) Join(group netip.Addr) error {
	return g.pc.JoinGroup(g.ifi, &net.UDPAddr{IP: group.AsSlice()})
}

func (g *udpGroups) Leave(group netip.Addr) error {
	return g.pc.LeaveGroup(g.ifi, &net.UDPAddr{IP: group.AsSlice()})
}

func (g *udpGroups) Close() error { return g.c.Close() }

// reopenIn returns a Reopen that finds the bridge by name in ns and opens
// new sockets on it there, whatever namespace the calling thread is in.
func reopenIn(ns netns.NsHandle) Reopen {
	return func(name string) (*net.Interface, Conns, error) {
		var (
			ifi *net.Interface
			c   Conns
		)
		err := inNamespace(ns, func() error {
			var err error
			if ifi, err = net.InterfaceByName(name); err != nil {
				return err
			}
			c, err = open(ifi)
			return err
		})
		if err != nil {
			return nil, Conns{}, err
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
