package registry

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// containerdTools is the directory of the lab's built containerd and ctr.
func containerdTools(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: containerd")
	}
	found, _ := filepath.Glob("/var/cache/labcloud/k8s-*/containerd")
	if len(found) == 0 {
		t.Skip("no built containerd in /var/cache/labcloud/k8s-*: run make tools")
	}
	return filepath.Dir(found[len(found)-1])
}

// startContainerd runs containerd on a temporary root and returns its socket.
func startContainerd(t *testing.T, tools string) string {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "containerd.sock")
	cfg := filepath.Join(dir, "config.toml")
	err := os.WriteFile(cfg, fmt.Appendf(nil, "version = 3\nroot = %q\nstate = %q\n[grpc]\n  address = %q\n",
		filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	d := exec.Command(filepath.Join(tools, "containerd"), "--config", cfg)
	d.Stdout, d.Stderr = &log, &log
	d.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Process.Kill(); _ = d.Wait() })
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return sock
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd did not listen within 20 s:\n%s", log.String())
		}
	}
}

// TestContainerdPullsThroughTheMirror proves the nodes' design with the
// lab's containerd: _default/hosts.toml (HostsTOML) sends a pull of any
// name to this registry's read-only handler with ?ns=, which finds the
// image loaded under that name; a name nobody loaded goes on to its own
// registry.
func TestContainerdPullsThroughTheMirror(t *testing.T) {
	tools := containerdTools(t)
	dir := t.TempDir()
	r, err := Open(filepath.Join(dir, "registry"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	nodes := httptest.NewServer(r.ReadOnly()) // as the nodes reach it
	defer nodes.Close()
	load := httptest.NewServer(r.ReadWrite()) // as labcloud load does
	defer load.Close()

	base, _ := random.Image(4096, 2)
	img, err := mutate.ConfigFile(base, &v1.ConfigFile{OS: "linux", Architecture: runtime.GOARCH,
		RootFS: mustConfig(t, base).RootFS})
	if err != nil {
		t.Fatal(err)
	}
	push(t, strings.TrimPrefix(load.URL, "http://"), "example.invalid/x/app:v1", img)

	hosts := filepath.Join(dir, "certs.d")
	if err := os.MkdirAll(filepath.Join(hosts, "_default"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hosts, "_default", "hosts.toml"), HostsTOML(strings.TrimPrefix(nodes.URL, "http://")), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := startContainerd(t, tools)
	ctr := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, filepath.Join(tools, "ctr"), append([]string{"--address", sock, "--namespace", "k8s.io"}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := ctr("images", "pull", "--hosts-dir", hosts, "example.invalid/x/app:v1"); err != nil {
		t.Fatalf("ctr images pull example.invalid/x/app:v1 through the mirror: %v\n%s", err, out)
	}
	out, err := ctr("images", "list")
	if err != nil {
		t.Fatal(err)
	}
	want := digest(t, img).String()
	if !strings.Contains(out, "example.invalid/x/app:v1") || !strings.Contains(out, want) {
		t.Errorf("containerd's images lack example.invalid/x/app:v1 at %s:\n%s", want, out)
	}
	// A name nobody loaded here: the mirror's 404 sends containerd on to
	// the name's own registry (here another on loopback), as it does for
	// any image on the internet.
	own := httptest.NewServer(ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0))))
	defer own.Close()
	elsewhere := strings.TrimPrefix(own.URL, "http://") + "/x/other:v1"
	if err := remote.Write(mustRef(t, elsewhere), img); err != nil {
		t.Fatal(err)
	}
	if out, err := ctr("images", "pull", "--hosts-dir", hosts, elsewhere); err != nil {
		t.Errorf("ctr images pull %s (not loaded) past the mirror: %v\n%s", elsewhere, err, out)
	}
}

func mustConfig(t *testing.T, img v1.Image) *v1.ConfigFile {
	t.Helper()
	c, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestContainerdPullsPlainHTTPRegistry: a registry on one of this host's
// own (not loopback) addresses speaks plain HTTP. containerd asks it over
// HTTPS and fails, until its certs.d/HOST:PORT/hosts.toml is
// PlainHTTPHostsTOML (up --insecure-registry); the lab's registry stays
// first.
func TestContainerdPullsPlainHTTPRegistry(t *testing.T) {
	tools := containerdTools(t)
	addr := hostAddress(t)
	dir := t.TempDir()
	r, err := Open(filepath.Join(dir, "registry"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	lab := httptest.NewServer(r.ReadOnly())
	defer lab.Close()
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	theirs := &httptest.Server{Listener: ln, Config: &http.Server{Handler: ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0)))}}
	theirs.Start()
	defer theirs.Close()
	registry := ln.Addr().String()

	base, _ := random.Image(4096, 1)
	img, err := mutate.ConfigFile(base, &v1.ConfigFile{OS: "linux", Architecture: runtime.GOARCH, RootFS: mustConfig(t, base).RootFS})
	if err != nil {
		t.Fatal(err)
	}
	ref := registry + "/team/app:v1"
	if err := remote.Write(mustRef(t, ref), img); err != nil {
		t.Fatal(err)
	}
	hosts := filepath.Join(dir, "certs.d")
	write := func(sub string, data []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(hosts, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(hosts, sub, "hosts.toml"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("_default", HostsTOML(strings.TrimPrefix(lab.URL, "http://")))
	sock := startContainerd(t, tools)
	pull := func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, filepath.Join(tools, "ctr"), "--address", sock, "--namespace", "k8s.io",
			"images", "pull", "--hosts-dir", hosts, ref).CombinedOutput()
		return string(out), err
	}
	if out, err := pull(); err == nil {
		t.Fatalf("ctr pulled %s from a plain-HTTP registry with no hosts.toml of its own: the test proves nothing\n%s", ref, out)
	}
	write(registry, PlainHTTPHostsTOML(strings.TrimPrefix(lab.URL, "http://"), registry))
	if out, err := pull(); err != nil {
		t.Fatalf("ctr images pull %s with PlainHTTPHostsTOML: %v\n%s", ref, err, out)
	}
}

// hostAddress is one of this host's own IPv4 addresses that is not
// loopback: containerd speaks plain HTTP to loopback of its own accord.
func hostAddress(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	t.Skip("this host has no IPv4 address but loopback")
	return ""
}
