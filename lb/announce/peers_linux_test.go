package announce

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

const testBase = "\x00labcloud/announce/br0/host" // as the kernel spells it

// diagMsg is the unix_diag_msg the kernel writes for b, with its name
// and owner.
func diagMsg(b bound) []byte {
	m := make([]byte, 16)
	m[0], m[1], m[2] = unix.AF_UNIX, unix.SOCK_STREAM, unix.BPF_TCP_CLOSE
	if b.packet {
		m[1] = unix.SOCK_SEQPACKET
	}
	if b.listening {
		m[2] = unix.BPF_TCP_LISTEN
	}
	binary.NativeEndian.PutUint32(m[4:], b.ino)
	uid := make([]byte, 4)
	binary.NativeEndian.PutUint32(uid, b.uid)
	m = append(m, nl.NewRtAttr(unixDiagName, []byte("\x00"+strings.TrimPrefix(b.name, "@"))).Serialize()...)
	return append(m, nl.NewRtAttr(unixDiagUID, uid).Serialize()...)
}

// TestParseBound: a socket is kept if it is named base or base + "/...",
// with its inode, owner, kind and state.
func TestParseBound(t *testing.T) {
	holder := bound{name: "@labcloud/announce/br0/host", ino: 7, uid: 0, packet: true, listening: true}
	for _, tc := range []struct {
		name string
		msg  []byte
		want bound
		ok   bool
	}{
		{"the name", diagMsg(holder), holder, true},
		{"a name under it", diagMsg(bound{name: "@labcloud/announce/br0/host/2", ino: 8, uid: 1000}), bound{name: "@labcloud/announce/br0/host/2", ino: 8, uid: 1000}, true},
		{"a longer name", diagMsg(bound{name: "@labcloud/announce/br0/hostile", packet: true, listening: true}), bound{}, false},
		{"another name", diagMsg(bound{name: "@other", packet: true, listening: true}), bound{}, false},
		{"no name", diagMsg(holder)[:16], bound{}, false},
		{"truncated", diagMsg(holder)[:15], bound{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseBound(tc.msg, testBase)
			if ok != tc.ok || ok && got != tc.want {
				t.Fatalf("parseBound = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// FuzzParseBound feeds arbitrary messages to the socket-listing parser: it
// keeps only sockets named base or base + "/...", and what it keeps reads
// back the same from the message the kernel would write for it.
func FuzzParseBound(f *testing.F) {
	for _, b := range []bound{
		{name: "@labcloud/announce/br0/host", ino: 7, packet: true, listening: true},
		{name: "@labcloud/announce/br0/host/1234", ino: 8, uid: 1000, packet: true},
		{name: "@labcloud/announce/br0/hostile", ino: 9},
	} {
		f.Add(diagMsg(b))
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, m []byte) {
		l, ok := parseBound(m, testBase)
		if !ok {
			return
		}
		if l.name != "@"+testBase[1:] && !strings.HasPrefix(l.name, "@"+testBase[1:]+"/") {
			t.Fatalf("kept %+v, not named %q", l, testBase)
		}
		if again, ok := parseBound(diagMsg(l), testBase); !ok || again != l {
			t.Fatalf("kept %+v, which reads back as %+v, %v", l, again, ok)
		}
	})
}
