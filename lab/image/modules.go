package image

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// Modules are the modules the boot initramfs loads, dependencies resolved
// from modules.dep: virtio (virtio_ring, virtio, virtio_pci_legacy_dev,
// virtio_pci_modern_dev, virtio_pci on Debian 12's cloud kernel), the root
// disk (virtio_blk, and ext4 where it is not built in), networking (failover,
// net_failover, virtio_net) and overlay for the root. Modules built into the
// kernel (modules.builtin) count as present and are skipped. The root disk
// has every other module, for modprobe.
var Modules = []string{"virtio_pci", "virtio_blk", "ext4", "virtio_net", "overlay"}

// GuestModules are the modules a node loads with modprobe from its root disk
// (noderoot/etc/lab-init/rc), for containers and kube-proxy. The builder
// checks the guest kernel has them, so a kernel without them fails here
// rather than in a node that boots without pod networking.
var GuestModules = []string{"overlay", "br_netfilter", "nf_conntrack", "veth", "bridge"}

// module is one kernel module resolved for the initramfs.
type module struct {
	Name string // virtio_net
	Rel  string // kernel/drivers/net/virtio_net.ko (without compression suffix)
	Data []byte // uncompressed
}

// modName turns a modules.dep path into a module name.
func modName(p string) string {
	b := path.Base(p)
	b, _, _ = strings.Cut(b, ".ko")
	return strings.ReplaceAll(b, "-", "_")
}

// parseModulesDep maps module names to their path and dependency paths.
func parseModulesDep(r io.Reader) (map[string]depEntry, error) {
	out := map[string]depEntry{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		file, deps, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("modules.dep: bad line %q", line)
		}
		out[modName(file)] = depEntry{path: file, deps: strings.Fields(deps)}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read modules.dep: %w", err)
	}
	return out, nil
}

type depEntry struct {
	path string
	deps []string
}

// moduleIndex is what /lib/modules/<release> says about its modules.
type moduleIndex struct {
	dir     string
	dep     map[string]depEntry
	builtin map[string]bool
}

func readModuleIndex(dir string) (*moduleIndex, error) {
	f, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("kernel modules: %w; install the guest kernel's modules of the same version (hack/install-deps.sh)", err)
	}
	defer f.Close()
	ix := &moduleIndex{dir: dir, builtin: map[string]bool{}}
	if ix.dep, err = parseModulesDep(f); err != nil {
		return nil, err
	}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		for _, l := range strings.Fields(string(b)) {
			ix.builtin[modName(l)] = true
		}
	}
	return ix, nil
}

// loadOrder returns the module paths to load for roots, dependencies
// first, each once. Built-in modules are skipped.
func (ix *moduleIndex) loadOrder(roots []string) ([]string, error) {
	var order []string
	done := map[string]bool{}
	visiting := map[string]bool{}
	var visit func(name string) error
	visit = func(name string) error {
		if done[name] || ix.builtin[name] {
			return nil
		}
		if visiting[name] {
			return fmt.Errorf("module dependency cycle at %s", name)
		}
		e, ok := ix.dep[name]
		if !ok {
			return fmt.Errorf("module %s: %w", name, errNoModule)
		}
		visiting[name] = true
		for _, d := range e.deps {
			if err := visit(modName(d)); err != nil {
				return err
			}
		}
		visiting[name] = false
		done[name] = true
		order = append(order, e.path)
		return nil
	}
	for _, r := range roots {
		if err := visit(r); err != nil {
			return nil, fmt.Errorf("kernel modules in %s: %w", ix.dir, err)
		}
	}
	return order, nil
}

var errNoModule = errors.New("neither in modules.dep nor built in")

// resolveModules reads the modules for roots from ix.dir, decompressed:
// busybox insmod cannot be relied on to read .ko.xz/.ko.zst.
func (ix *moduleIndex) resolveModules(roots []string) ([]module, error) {
	paths, err := ix.loadOrder(roots)
	if err != nil {
		return nil, err
	}
	mods := make([]module, 0, len(paths))
	for _, p := range paths {
		data, err := readModule(filepath.Join(ix.dir, p))
		if err != nil {
			return nil, err
		}
		rel := p
		for _, ext := range []string{".gz", ".xz", ".zst"} {
			rel = strings.TrimSuffix(rel, ext)
		}
		mods = append(mods, module{Name: modName(p), Rel: rel, Data: data})
	}
	return mods, nil
}

// readModule reads a module file, decompressing .ko.gz, .ko.xz (with the
// xz tool) and .ko.zst.
func readModule(p string) ([]byte, error) {
	raw, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("kernel module: %w", err)
	}
	switch {
	case strings.HasSuffix(p, ".ko"):
		return raw, nil
	case strings.HasSuffix(p, ".ko.gz"):
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("decompress %s: %w", p, err)
		}
		data, err := io.ReadAll(zr)
		if err != nil {
			return nil, fmt.Errorf("decompress %s: %w", p, err)
		}
		return data, nil
	case strings.HasSuffix(p, ".ko.xz"):
		return decompressWith(p, raw, "xz", "xz-utils")
	case strings.HasSuffix(p, ".ko.zst"):
		var out bytes.Buffer
		if _, err := unzstd(&out, bytes.NewReader(raw)); err != nil {
			return nil, fmt.Errorf("decompress %s: %w", p, err)
		}
		return out.Bytes(), nil
	}
	return nil, fmt.Errorf("kernel module %s: unknown file type", p)
}

// maxZstdWindow bounds the memory one zstd stream may ask for: a window is
// at most the stream's content, and 128 MiB is far above any kernel module.
const maxZstdWindow = 128 << 20

// unzstd streams zstd-compressed r into w, on one goroutine and in memory
// bounded by maxZstdWindow, however large the output; it returns the
// bytes written.
func unzstd(w io.Writer, r io.Reader) (int64, error) {
	d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxZstdWindow))
	if err != nil {
		return 0, err
	}
	defer d.Close()
	return d.WriteTo(w)
}

func decompressWith(p string, raw []byte, tool, pkg string) ([]byte, error) {
	bin, err := exec.LookPath(tool)
	if err != nil {
		return nil, fmt.Errorf("decompress %s: %s not installed: %w; apt-get install %s", p, tool, err, pkg)
	}
	var out, stderr bytes.Buffer
	cmd := exec.Command(bin, "-dc")
	cmd.Stdin = bytes.NewReader(raw)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("decompress %s with %s: %w: %s", p, tool, err, strings.TrimSpace(stderr.String()))
	}
	return out.Bytes(), nil
}
