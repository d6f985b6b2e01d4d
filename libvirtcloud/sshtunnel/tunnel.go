package sshtunnel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
)

// A host that answers TCP but not ssh (frozen, or not sshd) is given up
// after handshakeTimeout; libvirt's keepalive watches the connection
// after that.
const (
	dialTimeout      = 5 * time.Second
	handshakeTimeout = 10 * time.Second
	// acceptTimeout bounds how long a dialled tunnel waits for libvirt.
	acceptTimeout = 30 * time.Second
	// stderrMax bounds what is kept of the far side's complaints.
	stderrMax = 4096
)

// Conn is one ssh connection carrying one libvirt connection: libvirt
// opens URI, a Unix socket only this process's user may connect to, once.
type Conn struct {
	URI     string
	target  *Target
	command string // what the far side runs
	client  *ssh.Client
	stderr  *limitedBuffer
	once    sync.Once
}

// Dial opens an ssh connection to t, starts the remote side of libvirt's
// connection in it, and listens for libvirt on a fresh socket. Errors of
// ssh itself (no route, the host key, the key) are returned here, naming
// the host and the file; what the far side says after is for Explain.
func (t *Target) Dial(ctx context.Context, readOnly bool) (*Conn, error) {
	signer, err := t.signer()
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: dialTimeout}
	tcp, err := d.DialContext(ctx, "tcp", t.addr)
	if err != nil {
		return nil, fmt.Errorf("ssh %s@%s: %w", t.user, t.addr, err)
	}
	hostKey, algos, err := t.hostKeys(tcp.RemoteAddr())
	if err != nil {
		tcp.Close()
		return nil, err
	}
	_ = tcp.SetDeadline(time.Now().Add(handshakeTimeout))
	sc, chans, reqs, err := ssh.NewClientConn(tcp, t.addr, &ssh.ClientConfig{
		User:              t.user,
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback:   hostKey,
		HostKeyAlgorithms: algos,
	})
	if err != nil {
		tcp.Close()
		return nil, fmt.Errorf("ssh %s@%s: %w", t.user, t.addr, err)
	}
	_ = tcp.SetDeadline(time.Time{})
	c := &Conn{target: t, command: t.command(readOnly), client: ssh.NewClient(sc, chans, reqs), stderr: &limitedBuffer{max: stderrMax}}
	sess, err := c.client.NewSession()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("ssh %s@%s: session: %w", t.user, t.addr, err)
	}
	stdin, err1 := sess.StdinPipe()
	stdout, err2 := sess.StdoutPipe()
	sess.Stderr = c.stderr
	if err := errors.Join(err1, err2); err != nil {
		c.Close()
		return nil, err
	}
	if err := sess.Start(c.command); err != nil {
		c.Close()
		return nil, fmt.Errorf("ssh %s@%s: run %q: %w", t.user, t.addr, c.command, err)
	}
	ln, dir, err := listenPrivate()
	if err != nil {
		c.Close()
		return nil, err
	}
	c.URI = t.localURI(ln.Addr().String())
	go c.serve(ln, dir, stdin, stdout)
	return c, nil
}

// serve hands the first connection from this process's user to the ssh
// session and closes everything when either side ends.
func (c *Conn) serve(ln *net.UnixListener, dir string, stdin io.WriteCloser, stdout io.Reader) {
	_ = ln.SetDeadline(time.Now().Add(acceptTimeout))
	local, err := acceptOwn(ln)
	ln.Close()
	os.RemoveAll(dir)
	if err != nil {
		c.Close()
		return
	}
	defer local.Close()
	defer c.Close()
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(stdin, local)
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(local, stdout)
		done <- struct{}{}
	}()
	<-done // one side ended: the connection is over
}

// Close ends the ssh connection (and with it libvirt's).
func (c *Conn) Close() {
	c.once.Do(func() { c.client.Close() })
}

// Explain adds to a libvirt error what the far side wrote to stderr
// (virt-ssh-helper missing, a refused socket): libvirt itself only saw
// its connection end.
func (c *Conn) Explain(err error) error {
	if said := strings.TrimSpace(c.stderr.String()); said != "" {
		return fmt.Errorf("%w (%s@%s ran %q and said: %s)", err, c.target.user, c.target.addr, c.command, said)
	}
	return err
}

// listenPrivate listens on a socket in a new directory only this user
// can enter.
func listenPrivate() (*net.UnixListener, string, error) {
	dir, err := os.MkdirTemp("", "libvirt-ssh-")
	if err != nil {
		return nil, "", err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "sock"), Net: "unix"})
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", err
	}
	ln.SetUnlinkOnClose(true)
	return ln, dir, nil
}

// acceptOwn accepts one connection from a process of this user.
func acceptOwn(ln *net.UnixListener) (*net.UnixConn, error) {
	conn, err := ln.AcceptUnix()
	if err != nil {
		return nil, err
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) { cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || credErr != nil {
		conn.Close()
		return nil, errors.Join(err, credErr)
	}
	if int(cred.Uid) != os.Getuid() {
		conn.Close()
		return nil, fmt.Errorf("connection from uid %d refused", cred.Uid)
	}
	return conn, nil
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
