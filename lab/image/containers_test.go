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

// TestAgnhostShellRunsGNUWget runs what upstream e2e tests exec in the
// agnhost image, `/bin/sh -c 'wget ...'`, inside the layer we build (as a
// chroot) against an HTTP server on loopback. Debian's static busybox sh
// runs its own wget applet before PATH, and that applet crashes: the
// image's shell must be one that finds GNU wget.
func TestAgnhostShellRunsGNUWget(t *testing.T) {
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
	script := `mount -t proc proc "$1/proc" && exec chroot "$1" /bin/sh -c "$2"`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", script, "sh",
		root, fmt.Sprintf(`wget -T 5 -qO- "%s"`, ln.Addr()))
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	out, err := cmd.CombinedOutput()
	if err != nil || string(out) != "hello from loopback" {
		t.Fatalf("sh -c wget in the agnhost layer: %v, output %q", err, out)
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
