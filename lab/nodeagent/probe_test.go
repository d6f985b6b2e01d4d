package nodeagent

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
)

func probeGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

func portOf(t *testing.T, addr net.Addr) int {
	t.Helper()
	return addr.(*net.TCPAddr).Port
}

func TestProbe(t *testing.T) {
	// Node b listens on some port; node a's /reach asks peers on that port.
	b := httptest.NewServer(NewProbe("node-b", 0))
	defer b.Close()
	bPort := portOf(t, b.Listener.Addr())
	a := httptest.NewServer(NewProbe("node-a", bPort))
	defer a.Close()

	// A port where nothing listens, and a peer that fails.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := portOf(t, closed.Addr())
	closed.Close()
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	defer broken.Close()

	tests := []struct {
		name     string
		server   string
		path     string
		wantCode int
		wantBody string // prefix
	}{
		{"name", a.URL, "/", http.StatusOK, "node-a\n"},
		{"reach peer", a.URL, "/reach?addr=127.0.0.1", http.StatusOK, "node-b\n"},
		{"reach IPv6 literal form", a.URL, "/reach?addr=::ffff:127.0.0.1", http.StatusOK, "node-b\n"},
		{"not an IP", a.URL, "/reach?addr=example.com", http.StatusBadRequest, `addr "example.com": want an IP address`},
		{"no addr", a.URL, "/reach", http.StatusBadRequest, `addr "": want an IP address`},
		{"unknown path", a.URL, "/other", http.StatusNotFound, "404"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := probeGet(t, tt.server+tt.path)
			if code != tt.wantCode || !strings.HasPrefix(body, tt.wantBody) {
				t.Errorf("GET %s = %d %q; want %d %q...", tt.path, code, body, tt.wantCode, tt.wantBody)
			}
		})
	}

	t.Run("peer down", func(t *testing.T) {
		down := httptest.NewServer(NewProbe("node-a", closedPort))
		defer down.Close()
		code, body := probeGet(t, down.URL+"/reach?addr=127.0.0.1")
		if code != http.StatusBadGateway || !strings.Contains(body, "connection refused") {
			t.Errorf("reach to a closed port = %d %q; want 502 naming the error", code, body)
		}
	})
	t.Run("peer fails", func(t *testing.T) {
		p := httptest.NewServer(NewProbe("node-a", portOf(t, broken.Listener.Addr())))
		defer p.Close()
		code, body := probeGet(t, p.URL+"/reach?addr=127.0.0.1")
		if code != http.StatusBadGateway || !strings.Contains(body, "500") || !strings.Contains(body, "boom") {
			t.Errorf("reach to a failing peer = %d %q; want 502 with its status and body", code, body)
		}
	})
}

func TestServeProbeStopsWithContext(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ServeProbe(ctx, ln, NewProbe("node-a", ProbePort))
	}()
	if code, body := probeGet(t, "http://"+ln.Addr().String()+"/"); code != http.StatusOK || body != "node-a\n" {
		t.Fatalf("GET / = %d %q", code, body)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("ServeProbe did not return after the context ended")
	}
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Error("the probe still accepts connections after the context ended")
	}
}

func TestRunFailsWhenProbeAddressTaken(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	opts := Options{NodeName: "node-1", Client: fake.NewClientset(), Interfaces: newFakeInterfaces(), ProbeAddr: taken.Addr().String()}
	a, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	// A probe address in use fails Run at once, before any API call.
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), taken.Addr().String()) {
			t.Errorf("Run with the probe address taken = %v; want an error naming it", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not fail with the probe address taken")
	}
}
