package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestAgnhostShellRunsUpstreamProbes runs what upstream e2e tests exec in
// the agnhost image, `/bin/sh -c 'wget ...'` and `nc -v -t`, inside the layer we build (as a
// chroot) against an HTTP server on loopback. Debian's static busybox sh
// runs its own wget applet before PATH, and that applet crashes: the
// image's shell must be one that finds GNU wget.
func TestAgnhostShellRunsUpstreamProbes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: chroot into the image layer")
	}
	tools := t.TempDir()
	// Any static x86-64 binary stands in for agnhost: only the shell runs.
	if err := copyFile(DefaultBusybox, filepath.Join(tools, "agnhost")); err != nil {
		t.Fatal(err)
	}
	layer, err := agnhostLayer(DiskOptions{Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := untar(layer, root); err != nil {
		t.Fatal(err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "hello from loopback")
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	// A container has /proc, and busybox's shell execs its applets through
	// /proc/self/exe: mount one, in a mount namespace of the test's own.
	if err := os.MkdirAll(filepath.Join(root, "proc"), 0o755); err != nil {
		t.Fatal(err)
	}
	inImage := func(command string) (string, error) {
		script := `mount -t proc proc "$1/proc" && exec chroot "$1" /bin/sh -c "$2"`
		cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", script, "sh", root, command)
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := inImage(fmt.Sprintf(`wget -T 5 -qO- "%s"`, ln.Addr())); err != nil || out != "hello from loopback" {
		t.Errorf("sh -c wget in the agnhost layer: %v, output %q", err, out)
	}
	// A probe that must fail (a source range that drops it) is tried once,
	// as busybox's wget in upstream's image does: GNU wget would retry a
	// timed-out read 20 times, outlasting the e2e test's poll.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	accepted := make(chan net.Conn, 32)
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			accepted <- c // held open, never answered
		}
	}()
	if out, err := inImage(fmt.Sprintf(`wget -T 1 -qO- "%s"`, silent.Addr())); err == nil {
		t.Errorf("wget from a server that never answers succeeded: %q", out)
	}
	if n := len(accepted); n != 1 {
		t.Errorf("wget connected %d times to a server that never answers, want 1 (no retries)", n)
	}
	// CheckServiceReachability's probe: upstream's agnhost carries
	// netcat-openbsd, whose -v and -t busybox's small nc refuses.
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	if out, err := inImage(fmt.Sprintf(`echo hostName | nc -v -t -w 2 %s %s`, host, port)); err != nil {
		t.Errorf("sh -c 'nc -v -t' in the agnhost layer: %v, output %q", err, out)
	}
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}

// untar writes a layer's regular files, directories and symlinks under dir.
func untar(layer []byte, dir string) error {
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, strings.TrimSuffix(h.Name, "/"))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, os.FileMode(h.Mode).Perm())
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		case tar.TypeReg:
			var b []byte
			if b, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(p, b, os.FileMode(h.Mode).Perm())
			}
		}
		if err != nil {
			return err
		}
	}
}
