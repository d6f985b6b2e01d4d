// Package image builds what a lab node boots: a kernel, a small gzip'd newc
// cpio initramfs (busybox-static, the virtio and overlay modules, an /init
// that mounts the root disk), and the root disk itself (BuildRootDisk): a
// read-only ext4 image shared by every guest with kubelet, kube-proxy,
// containerd, runc, the CNI plugins and the container images.
//
// The initramfs and the disk are the same for every node. A node's identity,
// credentials and configuration files travel in a second, small archive
// (NodeArchive); Linux unpacks concatenated initramfs archives in order, so
// the lab boots each node with base+node as one initrd file
// (WriteNodeInitrd).
//
// Boot the result with the kernel command line in Cmdline, the root disk as
// the first virtio disk (read-only), a virtio-net NIC on a network with DHCP
// and SMBIOS system UUID = domain UUID (libvirt does this by default).
package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	"github.com/cavaliergopher/cpio"
)

// Cmdline is the kernel command line for a lab guest: serial console (the
// init and lab-node logs go there), reboot at once on panic, quiet kernel.
const Cmdline = "console=ttyS0,115200 panic=-1 quiet"

// DefaultBusybox is where Debian's busybox-static installs busybox.
const DefaultBusybox = "/bin/busybox"

// formatVersion changes whenever the layout of the image changes, so cached
// images built by older code are not reused.
const formatVersion = "labcloud-guest-image/2"

//go:embed rootfs
var rootfs embed.FS

// Options say what goes into the image.
type Options struct {
	// Kernel is the guest kernel (bzImage); default: FindKernel.
	Kernel string
	// ModulesDir holds the kernel's modules; default /lib/modules/<release
	// of Kernel>.
	ModulesDir string
	// Busybox is a static busybox; default DefaultBusybox.
	Busybox string
	// Out is the directory for the artifacts; created if missing. Required.
	Out string
}

// Artifacts are the built files.
type Artifacts struct {
	// Kernel is the kernel copied into Out ("vmlinuz").
	Kernel string
	// Initramfs is the base initramfs in Out ("initramfs.cpio.gz"), without
	// node configuration.
	Initramfs string
	// KernelRelease is the kernel's uname -r.
	KernelRelease string
	// Key is the content hash of every input; equal keys mean equal images.
	Key string
	// Cached says the artifacts in Out already matched Key.
	Cached bool
}

// Build writes the kernel and base initramfs into opts.Out. When Out
// already holds an image built from identical inputs (same content hash)
// nothing is written.
func Build(ctx context.Context, opts Options) (Artifacts, error) {
	in, err := readInputs(ctx, opts)
	if err != nil {
		return Artifacts{}, err
	}
	art := Artifacts{
		Kernel:        filepath.Join(opts.Out, "vmlinuz"),
		Initramfs:     filepath.Join(opts.Out, "initramfs.cpio.gz"),
		KernelRelease: in.release,
		Key:           in.key(),
	}
	keyFile := filepath.Join(opts.Out, "image.key")
	if b, err := os.ReadFile(keyFile); err == nil && strings.TrimSpace(string(b)) == art.Key &&
		exists(art.Kernel) && exists(art.Initramfs) {
		art.Cached = true
		return art, nil
	}
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return Artifacts{}, fmt.Errorf("image output directory: %w", err)
	}
	// The key goes last: a build cut short is never taken for a good one.
	_ = os.Remove(keyFile)
	var buf bytes.Buffer
	if err := writeGzip(&buf, in.tree().write); err != nil {
		return Artifacts{}, fmt.Errorf("build initramfs: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return Artifacts{}, err
	}
	if err := writeFileAtomic(art.Initramfs, buf.Bytes(), 0o644); err != nil {
		return Artifacts{}, err
	}
	if err := writeFileAtomic(art.Kernel, in.kernel, 0o644); err != nil {
		return Artifacts{}, err
	}
	if err := writeFileAtomic(keyFile, []byte(art.Key+"\n"), 0o644); err != nil {
		return Artifacts{}, err
	}
	return art, nil
}

// inputs are the resolved, read inputs of an image.
type inputs struct {
	kernel  []byte
	release string
	busybox []byte
	applets []string // bin/sh, usr/bin/awk, ...
	modules []module
	files   map[string][]byte // from rootfs
}

func readInputs(ctx context.Context, opts Options) (*inputs, error) {
	if opts.Out == "" {
		return nil, errors.New("image: Options.Out is empty")
	}
	var in inputs
	var err error
	if opts.Kernel == "" {
		if opts.Kernel, err = FindKernel(); err != nil {
			return nil, err
		}
	}
	if !exists(opts.Kernel) {
		return nil, fmt.Errorf("guest kernel %s missing; hack/install-deps.sh installs it", opts.Kernel)
	}
	if in.kernel, err = os.ReadFile(opts.Kernel); errors.Is(err, fs.ErrPermission) {
		return nil, fmt.Errorf("read guest kernel: %w (Ubuntu installs kernels readable by root only: run as root)", err)
	} else if err != nil {
		return nil, fmt.Errorf("read guest kernel: %w", err)
	}
	if in.release, err = KernelVersion(opts.Kernel); err != nil {
		return nil, err
	}
	if opts.ModulesDir == "" {
		opts.ModulesDir = filepath.Join("/lib/modules", in.release)
	}
	ix, err := readModuleIndex(opts.ModulesDir)
	if err != nil {
		return nil, err
	}
	if in.modules, err = ix.resolveModules(Modules); err != nil {
		return nil, err
	}
	if _, err := ix.loadOrder(GuestModules); err != nil {
		return nil, fmt.Errorf("guest kernel %s lacks what nodes load: %w", in.release, err)
	}

	if opts.Busybox == "" {
		opts.Busybox = DefaultBusybox
	}
	if !exists(opts.Busybox) {
		return nil, fmt.Errorf("busybox-static not installed: %s missing; apt-get install busybox-static", opts.Busybox)
	}
	if err := checkStatic(opts.Busybox, "busybox"); err != nil {
		return nil, fmt.Errorf("%w; apt-get install busybox-static", err)
	}
	if in.busybox, err = os.ReadFile(opts.Busybox); err != nil {
		return nil, fmt.Errorf("read busybox: %w", err)
	}
	if in.applets, err = busyboxApplets(ctx, opts.Busybox); err != nil {
		return nil, err
	}

	in.files = map[string][]byte{}
	err = fs.WalkDir(rootfs, "rootfs", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := rootfs.ReadFile(p)
		in.files[strings.TrimPrefix(p, "rootfs/")] = b
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("embedded rootfs: %w", err)
	}
	return &in, nil
}

// busyboxApplets asks busybox where its applets go ("bin/sh", ...).
func busyboxApplets(ctx context.Context, bin string) ([]string, error) {
	out, err := exec.CommandContext(ctx, bin, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list-full: %w", err)
	}
	applets := strings.Fields(string(out))
	if len(applets) == 0 {
		return nil, errors.New("busybox --list-full: no applets")
	}
	return applets, nil
}

// key hashes every input, each with its name and length, so no two
// different input sets collide by concatenation.
func (in *inputs) key() string {
	h := sha256.New()
	part := func(name string, data []byte) {
		fmt.Fprintf(h, "%s %d\n", name, len(data))
		h.Write(data)
	}
	part("format", []byte(formatVersion))
	part("kernel", in.kernel)
	part("release", []byte(in.release))
	part("busybox", in.busybox)
	part("applets", []byte(strings.Join(in.applets, "\n")))
	for _, m := range in.modules {
		part("module "+m.Rel, m.Data)
	}
	for _, p := range sortedKeys(in.files) {
		part("file "+p, in.files[p])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// tree lays out the base initramfs.
func (in *inputs) tree() tree {
	t := tree{}
	for _, d := range []string{"dev", "proc", "sys", "run"} {
		t.dir(d, 0o755)
	}
	t.dir("tmp", 0o1777)
	t.dir("root", 0o700)
	t.symlink("var/run", "/run")

	t.file("bin/busybox", 0o755, in.busybox)
	for _, a := range in.applets {
		a = clean(a)
		if a == "bin/busybox" || a == "init" {
			continue
		}
		t.symlink(a, "/bin/busybox")
	}

	var list strings.Builder
	for _, m := range in.modules {
		p := path.Join("lib/modules", in.release, m.Rel)
		t.file(p, 0o644, m.Data)
		fmt.Fprintf(&list, "%s /%s\n", m.Name, p)
	}
	t.file("etc/lab-init/modules", 0o644, []byte(list.String()))

	for p, b := range in.files {
		perm := cpio.FileMode(0o644)
		if bytes.HasPrefix(b, []byte("#!")) {
			perm = 0o755
		}
		t.file(p, perm, b)
	}
	return t
}

func writeGzip(w io.Writer, body func(io.Writer) error) error {
	zw := gzip.NewWriter(w)
	if err := body(zw); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("gzip: %w", err)
	}
	return nil
}

// writeFileAtomic writes data to a temporary file beside p and renames it
// into place, so readers never see half a file.
func writeFileAtomic(p string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after the rename
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
