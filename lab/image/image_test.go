package image

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cavaliergopher/cpio"
)

func TestCompareVersions(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"6.1.0-56-cloud-amd64", "6.1.0-56-cloud-amd64", 0},
		{"6.1.0-9-cloud-amd64", "6.1.0-10-cloud-amd64", -1},
		{"6.10.0-1-cloud-amd64", "6.9.0-30-cloud-amd64", 1},
		{"6.1.0-56-cloud-amd64", "6.1.0-56a-cloud-amd64", -1},
		{"6.1", "6.1.0", -1},
	}
	for _, tc := range tests {
		if got := compareVersions(tc.a, tc.b); got != tc.want {
			t.Errorf("compareVersions(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := compareVersions(tc.b, tc.a); got != -tc.want {
			t.Errorf("compareVersions(%q, %q) = %d, want %d", tc.b, tc.a, got, -tc.want)
		}
	}
}

func TestBzImageVersion(t *testing.T) {
	img := make([]byte, 0x400)
	copy(img[0x202:], "HdrS")
	img[0x20e] = 0x00 // version at 0x100+0x200
	img[0x20f] = 0x01
	copy(img[0x300:], "6.1.0-56-cloud-amd64 (debian-kernel@lists.debian.org) #1 SMP\x00")
	if got := bzImageVersion(img); got != "6.1.0-56-cloud-amd64" {
		t.Errorf("bzImageVersion = %q", got)
	}
	if got := bzImageVersion(make([]byte, 0x400)); got != "" {
		t.Errorf("bzImageVersion(no header) = %q, want empty", got)
	}
	if got := bzImageVersion([]byte("short")); got != "" {
		t.Errorf("bzImageVersion(short) = %q, want empty", got)
	}
}

const testModulesDep = `kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/net/core/failover.ko:
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/net/dummy.ko.xz:
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/fs/overlayfs/overlay.ko.xz:
kernel/drivers/char/hw_random/virtio-rng.ko.zst: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
`

func TestLoadOrder(t *testing.T) {
	dep, err := parseModulesDep(strings.NewReader(testModulesDep))
	if err != nil {
		t.Fatal(err)
	}
	names := func(paths []string) []string {
		var out []string
		for _, p := range paths {
			out = append(out, modName(p))
		}
		return out
	}
	tests := []struct {
		name    string
		roots   []string
		builtin map[string]bool
		want    []string
		wantErr error
	}{{
		name:    "lab modules",
		roots:   Modules,
		builtin: map[string]bool{"ext4": true},
		want: []string{"virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_ring", "virtio",
			"virtio_pci", "virtio_blk", "failover", "net_failover", "virtio_net", "overlay"},
	}, {
		name:    "virtio built in",
		roots:   []string{"virtio_net"},
		builtin: map[string]bool{"virtio": true, "virtio_ring": true},
		want:    []string{"failover", "net_failover", "virtio_net"},
	}, {
		name:  "dash in file name",
		roots: []string{"virtio_rng"},
		want:  []string{"virtio_ring", "virtio", "virtio_rng"},
	}, {
		name:    "missing",
		roots:   []string{"e1000"},
		wantErr: errNoModule,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := (&moduleIndex{dep: dep, builtin: tc.builtin}).loadOrder(tc.roots)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if !slices.Equal(names(got), tc.want) {
				t.Errorf("order = %v, want %v", names(got), tc.want)
			}
		})
	}
}

func TestReadModuleCompressed(t *testing.T) {
	dir := t.TempDir()
	payload := []byte("\x7fELF fake module")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(payload)
	zw.Close()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, p := range []string{write("a.ko", payload), write("b.ko.gz", gz.Bytes())} {
		got, err := readModule(p)
		if err != nil || !bytes.Equal(got, payload) {
			t.Errorf("readModule(%s) = %q, %v", p, got, err)
		}
	}
	// Files made by the xz and zstd tools, as distributions make them, when
	// installed; xz is decompressed by its tool, zstd in process.
	for _, tool := range []struct{ bin, ext string }{{"xz", ".xz"}, {"zstd", ".zst"}} {
		if _, err := os.Stat("/usr/bin/" + tool.bin); err != nil {
			t.Logf("%s not installed; not testing .ko%s", tool.bin, tool.ext)
			continue
		}
		raw := write("c.ko", payload)
		if out, err := runTool(tool.bin, "-k", "-f", raw); err != nil {
			t.Fatalf("%s: %v: %s", tool.bin, err, out)
		}
		got, err := readModule(raw + tool.ext)
		if err != nil || !bytes.Equal(got, payload) {
			t.Errorf("readModule(.ko%s) = %q, %v", tool.ext, got, err)
		}
	}
	if _, err := readModule(write("d.ko.bz2", payload)); err == nil {
		t.Error("readModule(.ko.bz2) succeeded, want an error")
	}
}

// readArchive lists a gzip'd cpio archive: path -> header and content.
func readArchive(t *testing.T, gz []byte) (map[string]*cpio.Header, map[string][]byte) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	zr.Multistream(false)
	r := cpio.NewReader(zr)
	hdrs := map[string]*cpio.Header{}
	data := map[string][]byte{}
	for {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		hdrs[h.Name] = h
		if data[h.Name], err = io.ReadAll(r); err != nil {
			t.Fatal(err)
		}
	}
	return hdrs, data
}

func TestTreeWrite(t *testing.T) {
	tr := tree{}
	tr.file("/etc/lab-init/modules", 0o644, []byte("x\n"))
	tr.symlink("usr/bin/awk", "/bin/busybox")
	tr.dir("tmp", 0o1777)
	var a, b bytes.Buffer
	if err := writeGzip(&a, tr.write); err != nil {
		t.Fatal(err)
	}
	if err := writeGzip(&b, tr.write); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two writes of the same tree differ")
	}
	hdrs, _ := readArchive(t, a.Bytes())
	var names []string
	for n := range hdrs {
		names = append(names, n)
	}
	slices.Sort(names)
	want := []string{"etc", "etc/lab-init", "etc/lab-init/modules", "tmp", "usr", "usr/bin", "usr/bin/awk"}
	if !slices.Equal(names, want) {
		t.Errorf("entries = %v, want %v", names, want)
	}
	if h := hdrs["usr/bin/awk"]; h.Mode&cpio.ModeType != cpio.TypeSymlink || h.Linkname != "/bin/busybox" {
		t.Errorf("symlink: mode %o target %q", h.Mode, h.Linkname)
	}
	if h := hdrs["tmp"]; h.Mode != cpio.TypeDir|0o1777 {
		t.Errorf("tmp mode = %o", h.Mode)
	}
}

func TestNodeArchive(t *testing.T) {
	files := []NodeFile{
		{Path: "/etc/hostname", Mode: 0o644, Data: []byte("node-1\n")},
		{Path: "/etc/kubernetes/kubelet.conf", Mode: 0o600, Data: []byte("token: tok\n")},
	}
	gz, err := NodeArchive(files)
	if err != nil {
		t.Fatal(err)
	}
	hdrs, data := readArchive(t, gz)
	if h := hdrs["node-config/etc/kubernetes/kubelet.conf"]; h == nil || h.Mode != cpio.TypeReg|0o600 {
		t.Fatalf("kubelet.conf header = %+v, want a 0600 file under node-config/", h)
	}
	if string(data["node-config/etc/hostname"]) != "node-1\n" {
		t.Errorf("hostname = %q", data["node-config/etc/hostname"])
	}
	if _, err := NodeArchive([]NodeFile{{Path: "etc/hostname"}}); err == nil || !strings.Contains(err.Error(), "etc/hostname") {
		t.Errorf("NodeArchive(relative path) error = %v, want one naming the path", err)
	}

	// The node initrd is base, padding, node archive.
	dir := t.TempDir()
	base := filepath.Join(dir, "base.gz")
	if err := os.WriteFile(base, []byte{0x1f, 0x8b, 1, 2, 3}, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "node.initrd")
	if err := WriteNodeInitrd(out, base, files); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte{0x1f, 0x8b, 1, 2, 3, 0, 0, 0}, gz...)
	if !bytes.Equal(got, want) {
		t.Errorf("node initrd is not base+padding+node archive")
	}
	if fi, _ := os.Stat(out); fi.Mode().Perm() != 0o600 {
		t.Errorf("node initrd mode = %v, want 0600", fi.Mode())
	}
}

func TestBuildErrorsNameTheInput(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"no out", Options{}, "Options.Out"},
		{"kernel missing", Options{Out: dir, Kernel: "/nonexistent/vmlinuz"}, "guest kernel /nonexistent/vmlinuz missing"},
		{"busybox missing", Options{Out: dir, Busybox: "/nonexistent/busybox"}, "busybox-static not installed: /nonexistent/busybox missing"},
		{"busybox dynamic", Options{Out: dir, Busybox: "/usr/bin/qemu-system-x86_64"}, "dynamically linked"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if strings.HasPrefix(tc.name, "busybox") {
				if _, err := FindKernel(); err != nil {
					t.Skipf("needs the guest kernel: %v", err)
				}
			}
			if tc.name == "busybox dynamic" {
				if _, err := os.Stat(tc.opts.Busybox); err != nil {
					t.Skip("no dynamic binary at hand")
				}
			}
			_, err := Build(t.Context(), tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Build error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}
