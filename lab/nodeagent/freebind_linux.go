package nodeagent

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// freebind lets a listener bind to a VIP that is not usable yet: an IPv6
// address stays tentative for a moment after it is added, even on lo.
func freebind(network, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if network == "tcp6" {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
		}
	})
	if err != nil {
		return err
	}
	return serr
}
