package relay

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
)

// echoServer answers each line with "echo: " + line, and closes its side
// once the client has closed its own (so half-close must be forwarded).
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				s := bufio.NewScanner(c)
				for s.Scan() {
					if _, err := io.WriteString(c, "echo: "+s.Text()+"\n"); err != nil {
						return
					}
				}
				_, _ = io.WriteString(c, "bye\n")
			}()
		}
	}()
	return l.Addr().String()
}

func TestForward(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	target := echoServer(t)
	f, err := ListenHost()
	if err != nil {
		t.Fatal(err)
	}
	addr, err := Addr(f)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(addr, "127.0.0.1:") || strings.HasSuffix(addr, ":0") {
		t.Fatalf("listener address %s, want 127.0.0.1 and a port", addr)
	}
	// As the daemon gets it: a listener from an inherited descriptor.
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, l, target) }()

	for i := 0; i < 3; i++ { // several connections, one after the other and at once
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "hello\nworld\n"); err != nil {
			t.Fatal(err)
		}
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("read through the forwarder: %v (got %q)", err, got)
		}
		if want := "echo: hello\necho: world\nbye\n"; string(got) != want {
			t.Errorf("through the forwarder: %q, want %q", got, want)
		}
	}

	// An open connection and the listener end with the context.
	open, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if _, err := io.WriteString(open, "ping\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(open).ReadString('\n'); err != nil || line != "echo: ping\n" {
		t.Fatalf("open connection: %q, %v", line, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Forward after cancel = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Forward did not return after its context ended")
	}
	_ = open.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(open); err != nil {
		t.Errorf("open connection not closed when Forward ended: %v", err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("the listener still accepts after Forward ended")
	}
}

// A target that refuses: the client's connection is closed, and the
// forwarder keeps serving.
func TestForwardTargetDown(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := dead.Addr().String()
	dead.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = Serve(ctx, l, target) }()
	for i := 0; i < 2; i++ {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || os.IsTimeout(err) {
			t.Errorf("connection %d to a dead target: read %d, %v; want it closed", i, n, err)
		}
		c.Close()
	}
}
