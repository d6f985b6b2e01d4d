package announce

import (
	"fmt"
	"net"

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
