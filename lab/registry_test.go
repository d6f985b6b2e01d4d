package lab

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/labcloud/labcloud/internal/nstest"
)

// labcloud load dials the registry's loopback address inside the lab's
// namespace from the host's: the connection reaches a server there, which
// the host's own loopback does not have.
func TestDialInNetns(t *testing.T) {
	ns := nstest.Named(t, "lc-load")
	var l net.Listener
	nstest.InNamed(t, ns, func() {
		var err error
		if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	})
	defer l.Close()
	go func() {
		_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "in the lab") }))
	}()
	addr := l.Addr().String()

	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatalf("%s answers on the host's loopback too: the test proves nothing", addr)
	}
	client := &http.Client{Transport: &http.Transport{DialContext: dialInNetns(ns)}}
	for range 3 { // new connections each time, each dialled on a thread of its own
		client.CloseIdleConnections()
		resp, err := client.Get("http://" + addr)
		if err != nil {
			t.Fatalf("dial in %s: %v", ns, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "in the lab" {
			t.Fatalf("got %q", b)
		}
	}
	// This goroutine's namespace is still the host's.
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Error("after dialling in the lab's namespace, a plain dial reaches it too")
	}
	if _, err := dialInNetns("lc-load-absent")(context.Background(), "tcp", addr); err == nil || !strings.Contains(err.Error(), "lc-load-absent") {
		t.Errorf("a namespace that does not exist: %v", err)
	}
}
