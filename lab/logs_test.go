package lab

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestLogSources(t *testing.T) {
	full := &State{Dir: "/s", Nodes: []string{"lab-node-1", "lab-node-2"}}
	light := &State{Dir: "/s", Light: true, Nodes: []string{"lab-node-1"}}
	names := func(st *State) []string {
		var out []string
		for _, s := range LogSources(st) {
			out = append(out, s.Component)
		}
		return out
	}
	if got, want := names(full), []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "coredns", "ccm", "libvirtd", "virtlogd", "registry", "apiserver-forwarder", "lab-node-1", "lab-node-2"}; !slices.Equal(got, want) {
		t.Errorf("full lab components %q, want %q", got, want)
	}
	if got, want := names(light), []string{"etcd", "kube-apiserver", "kube-controller-manager", "ccm", "simulator", "apiserver-forwarder"}; !slices.Equal(got, want) {
		t.Errorf("light lab components %q, want %q", got, want)
	}
	// The paths are where the lab's code writes them.
	for name, want := range map[string]string{
		"kube-apiserver": "/s/controlplane/kube-apiserver.log", "ccm": "/s/ccm.log",
		"libvirt-cloud-controller-manager": "/s/ccm.log", "libvirtd": "/s/libvirtd.log",
		"lab-node-2": "/s/nodes/lab-node-2.console", "apiserver-forwarder": "/s/apiserver-forwarder.log",
	} {
		s, err := FindLog(full, name)
		if err != nil || s.Path != want {
			t.Errorf("FindLog(%s) = %+v, %v; want %s", name, s, err, want)
		}
	}
	if _, err := FindLog(full, "kubelet"); err == nil || !strings.Contains(err.Error(), "lab-node-1") {
		t.Errorf("FindLog(kubelet) = %v, want an error listing the components", err)
	}
	if _, err := FindLog(light, "libvirtd"); err == nil {
		t.Error("the light lab has no libvirtd log")
	}
	if n := LogNames(full); !slices.Contains(n, "libvirt-cloud-controller-manager") || !slices.Contains(n, "ccm") {
		t.Errorf("LogNames lacks the CCM's names: %q", n)
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCopyLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.log")
	ctx := context.Background()
	if err := CopyLog(ctx, path, &bytes.Buffer{}, false, time.Millisecond); err == nil {
		t.Error("a missing log without -f is an error")
	}
	if err := os.WriteFile(path, []byte("one\ntwo\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := CopyLog(ctx, path, &b, false, time.Millisecond); err != nil || b.String() != "one\ntwo\n" {
		t.Errorf("CopyLog = %q, %v", b.String(), err)
	}
}

func TestCopyLogFollows(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.log")
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- CopyLog(ctx, path, &out, true, 5*time.Millisecond) }()

	// The file appears later, grows, is truncated (a restart), grows again.
	time.Sleep(30 * time.Millisecond)
	if err := os.WriteFile(path, []byte("first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new file's line", func() bool { return out.String() == "first\n" })
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("second\n")
	f.Close()
	waitFor(t, "the appended line", func() bool { return out.String() == "first\nsecond\n" })
	if err := os.WriteFile(path, []byte("x\n"), 0o600); err != nil { // truncated, then written
		t.Fatal(err)
	}
	waitFor(t, "the line after truncation", func() bool { return out.String() == "first\nsecond\nx\n" })

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("CopyLog -f after cancel = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("CopyLog -f did not end with its context")
	}
}

func TestExportLogFiles(t *testing.T) {
	dir := t.TempDir()
	st := &State{Dir: dir, Nodes: []string{"lab-node-1"}}
	for name, data := range map[string]string{
		"controlplane/kube-apiserver.log": "apiserver\n", "ccm.log": "ccm\n", "nodes/lab-node-1.console": "console\n",
		"state.json": "{}\n", "cloud-config.yaml": "region: lab\n",
		"controlplane/admin.kubeconfig": "secret", "ccm.kubeconfig": "secret", "controlplane/tokens.csv": "secret",
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	qemu := t.TempDir()
	if err := os.WriteFile(filepath.Join(qemu, "lab-node-1.log"), []byte("qemu\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if err := exportLogFiles(st, out, qemu); err != nil {
		t.Fatalf("ExportLogFiles: %v (a missing log is no error)", err)
	}
	for name, want := range map[string]string{
		"kube-apiserver.log": "apiserver\n", "ccm.log": "ccm\n", "nodes/lab-node-1/console.log": "console\n",
		"nodes/lab-node-1/qemu.log": "qemu\n", "state.json": "{}\n", "cloud-config.yaml": "region: lab\n",
	} {
		if got, err := os.ReadFile(filepath.Join(out, name)); err != nil || string(got) != want {
			t.Errorf("%s: %q, %v; want %q", name, got, err, want)
		}
	}
	_ = filepath.Walk(out, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			if data, _ := os.ReadFile(p); strings.Contains(string(data), "secret") {
				t.Errorf("exported a secret: %s", p)
			}
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(out, "etcd.log")); err == nil {
		t.Error("a log the lab never wrote was exported")
	}
}
