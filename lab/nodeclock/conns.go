package nodeclock

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ResetConnections aborts every TCP connection of this network namespace
// to remote, as ss -K does: a node restored from a snapshot holds
// connections to an API server process that is gone, and a client that
// only watches (kube-proxy) sends nothing that would draw the reset that
// ends them; it would notice only at its HTTP/2 health check, up to 45 s
// later, and see no Service or endpoint change until then. Aborted, every
// client reconnects at once. It returns how many it aborted.
func ResetConnections(remote netip.AddrPort) (int, error) {
	family := uint8(unix.AF_INET)
	if remote.Addr().Is6() && !remote.Addr().Is4In6() {
		family = unix.AF_INET6
	}
	socks, err := netlink.SocketDiagTCP(family)
	if err != nil {
		return 0, fmt.Errorf("list TCP sockets: %w", err)
	}
	var errs []error
	n := 0
	for _, s := range socks {
		dst, ok := netip.AddrFromSlice(s.ID.Destination)
		if !ok || s.ID.DestinationPort != remote.Port() || dst.Unmap() != remote.Addr().Unmap() {
			continue
		}
		if err := destroy(family, s.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// destroy sends SOCK_DESTROY for the socket id (its cookie included, so
// only that socket matches).
func destroy(family uint8, id netlink.SocketID) error {
	req := nl.NewNetlinkRequest(nl.SOCK_DESTROY, unix.NLM_F_ACK)
	req.AddData(&destroyRequest{family: family, id: id})
	_, err := req.Execute(unix.NETLINK_INET_DIAG, 0)
	if err != nil {
		return fmt.Errorf("abort %s:%d -> %s:%d: %w", id.Source, id.SourcePort, id.Destination, id.DestinationPort, err)
	}
	return nil
}

// destroyRequest is struct inet_diag_req_v2 for one TCP socket.
type destroyRequest struct {
	family uint8
	id     netlink.SocketID
}

const sizeofDestroyRequest = 56

func (r *destroyRequest) Len() int { return sizeofDestroyRequest }

func (r *destroyRequest) Serialize() []byte {
	b := make([]byte, sizeofDestroyRequest)
	b[0], b[1] = r.family, unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(b[4:], 0xfff) // every state
	binary.BigEndian.PutUint16(b[8:], r.id.SourcePort)
	binary.BigEndian.PutUint16(b[10:], r.id.DestinationPort)
	src, dst := r.id.Source, r.id.Destination
	if r.family == unix.AF_INET {
		src, dst = src.To4(), dst.To4()
	}
	copy(b[12:28], src)
	copy(b[28:44], dst)
	binary.NativeEndian.PutUint32(b[44:], r.id.Interface)
	binary.NativeEndian.PutUint32(b[48:], r.id.Cookie[0])
	binary.NativeEndian.PutUint32(b[52:], r.id.Cookie[1])
	return b
}
