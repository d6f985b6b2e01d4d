package lab

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2/ktesting"

	"github.com/labcloud/labcloud/lab/controlplane"
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
	addr, err := listenerAddr(f)
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
	go func() { done <- Forward(ctx, l, target) }()

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
	go func() { _ = Forward(ctx, l, target) }()
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

func TestWriteHostKubeconfig(t *testing.T) {
	dir := t.TempDir()
	admin, host := filepath.Join(dir, "admin.kubeconfig"), filepath.Join(dir, "kubeconfig")
	if err := controlplane.WriteKubeconfig(admin, "https://10.123.0.1:6443", []byte("CA"), "labcloud-admin", "tok"); err != nil {
		t.Fatal(err)
	}
	if err := writeHostKubeconfig(admin, host, "https://127.0.0.1:40000"); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(host)
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Clusters[cfg.Contexts[cfg.CurrentContext].Cluster]
	u := cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo]
	if c.Server != "https://127.0.0.1:40000" || string(c.CertificateAuthorityData) != "CA" || u.Token != "tok" {
		t.Errorf("host kubeconfig: server %s, CA %q, token %q", c.Server, c.CertificateAuthorityData, u.Token)
	}
	if a, _ := clientcmd.LoadFromFile(admin); a.Clusters["labcloud"].Server != "https://10.123.0.1:6443" {
		t.Error("the admin kubeconfig changed")
	}
}

func TestCheckCCMServing(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "admin.kubeconfig")
	if err := controlplane.WriteKubeconfig(kc, "https://10.123.0.1:6443", []byte("CA"), "labcloud-admin", "admintoken"); err != nil {
		t.Fatal(err)
	}
	var metricsStatus atomic.Int32
	metricsStatus.Store(http.StatusForbidden)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/healthz":
			_, _ = io.WriteString(w, "ok")
		case r.URL.Path == "/metrics" && r.Header.Get("Authorization") == "Bearer admintoken":
			w.WriteHeader(int(metricsStatus.Load()))
		default:
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	err := checkCCMServing(ctx, kc, srv.URL, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "/metrics: 403") {
		t.Errorf("metrics forbidden: err = %v, want one naming /metrics and 403", err)
	}
	metricsStatus.Store(http.StatusOK)
	if err := checkCCMServing(ctx, kc, srv.URL, 5*time.Second); err != nil {
		t.Errorf("serving: %v", err)
	}
}
