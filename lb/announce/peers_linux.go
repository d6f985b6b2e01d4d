package announce

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// trusted says whether a process of uid may take part in the leader and
// stand-in protocol: root, or this process's own user (who can kill it
// anyway). Anyone else on the host can bind our abstract names too, so
// every holder and every peer is checked against this.
func trusted(uid uint32) bool {
	return uid == 0 || uid == uint32(os.Geteuid())
}

// bound is a Unix socket of the network namespace bound to a name.
type bound struct {
	name string // as net.UnixAddr spells it: "@..." for an abstract name
	ino  uint32
	uid  uint32 // its owner's; 0 if the kernel does not say (before 5.3)
	// packet: a SOCK_SEQPACKET socket, the only kind our names use.
	packet    bool
	listening bool
}

// holds says whether b may be a process of ours holding one of our names.
func (b bound) holds() bool { return b.packet && b.listening && trusted(b.uid) }

// From linux/unix_diag.h, which x/sys does not carry.
const (
	udiagShowName = 0x01
	udiagShowUID  = 0x40
	unixDiagName  = 0
	unixDiagUID   = 7
)

type unixDiagReq struct{ states, show uint32 }

func (r unixDiagReq) Len() int { return 24 }

func (r unixDiagReq) Serialize() []byte {
	b := make([]byte, r.Len())
	b[0] = unix.AF_UNIX
	binary.NativeEndian.PutUint32(b[4:], r.states)
	binary.NativeEndian.PutUint32(b[12:], r.show)
	return b
}

// named lists the sockets of this network namespace bound to base or to
// base + "/...", listening or not. It asks the kernel (sock_diag) rather
// than connecting, so that the owner of a socket that never accepts is
// known too. Connections are left out: one to a listener carries its
// name, and before it is accepted its owner reads as root.
func named(base string) ([]bound, error) {
	abstract := "\x00" + strings.TrimPrefix(base, "@")
	for range 3 {
		req := nl.NewNetlinkRequest(nl.SOCK_DIAG_BY_FAMILY, unix.NLM_F_DUMP)
		req.AddData(unixDiagReq{
			states: 1<<unix.BPF_TCP_LISTEN | 1<<unix.BPF_TCP_CLOSE,
			show:   udiagShowName | udiagShowUID,
		})
		msgs, err := req.Execute(unix.NETLINK_SOCK_DIAG, nl.SOCK_DIAG_BY_FAMILY)
		if errors.Is(err, nl.ErrDumpInterrupted) {
			continue // a holder may be missing: ask again
		}
		if err != nil {
			return nil, fmt.Errorf("listing Unix sockets: %w", err)
		}
		var out []bound
		for _, m := range msgs {
			if l, ok := parseBound(m, abstract); ok {
				out = append(out, l)
			}
		}
		return out, nil
	}
	return nil, errors.New("listing Unix sockets: dump interrupted three times")
}

// parseBound reads one unix_diag_msg, keeping it if it is named base (in
// its kernel spelling) or base + "/...".
func parseBound(m []byte, base string) (bound, bool) {
	if len(m) < 16 {
		return bound{}, false
	}
	// The kernel pads every attribute to 4 bytes; nl.ParseRouteAttr
	// panics on a last one that is not, so pad it here.
	b := m[16:]
	if r := len(b) % 4; r != 0 {
		b = append(bytes.Clone(b), make([]byte, 4-r)...)
	}
	attrs, err := nl.ParseRouteAttr(b)
	if err != nil {
		return bound{}, false
	}
	l := bound{
		ino:       binary.NativeEndian.Uint32(m[4:]),
		packet:    m[1] == unix.SOCK_SEQPACKET,
		listening: m[2] == unix.BPF_TCP_LISTEN,
	}
	named := false
	for _, a := range attrs {
		switch a.Attr.Type {
		case unixDiagName:
			n := string(a.Value)
			if n != base && !strings.HasPrefix(n, base+"/") {
				return bound{}, false
			}
			l.name, named = "@"+n[1:], true
		case unixDiagUID:
			if len(a.Value) >= 4 {
				l.uid = binary.NativeEndian.Uint32(a.Value)
			}
		}
	}
	return l, named
}

// peerCred is the credentials of c's peer: of the connecting process on an
// accepted connection, of the listening process on a dialled one.
func peerCred(c syscall.Conn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// dial connects to the listener on name and says who listens there.
func dial(name string) (*net.UnixConn, *unix.Ucred, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: name, Net: "unixpacket"})
	if err != nil {
		return nil, nil, err
	}
	cred, err := peerCred(c)
	if err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("reading the credentials of %s: %w", name, err)
	}
	return c, cred, nil
}
