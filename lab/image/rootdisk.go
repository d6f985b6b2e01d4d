package image

import (
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
	"regexp"
	"slices"
	"strings"
)

// The root disk of a lab node: one ext4 image, attached read-only to every
// guest (the host's page cache holds it once), with everything a kubeadm node
// runs: kubelet, kube-proxy, containerd and its runc shim, runc, iptables, the
// CNI plugins, the kernel's modules, lab-node, and the container images pods
// need (imported into a containerd root on the disk, mounted at boot, so
// nothing is ever pulled). The
// boot initramfs mounts it under a tmpfs overlay and switches to it.

// diskFormatVersion changes whenever the disk's layout changes.
const diskFormatVersion = "labcloud-node-disk/2"

//go:embed noderoot
var noderoot embed.FS

// DiskOptions say what goes onto the root disk.
type DiskOptions struct {
	// Tools holds kubelet, kube-proxy, containerd, containerd-shim-runc-v2,
	// ctr, agnhost and cni/ (hack/build-tools.sh). Required.
	Tools string
	// LabNode is the static lab-node binary. Required.
	LabNode string
	// Busybox is a static busybox; default DefaultBusybox.
	Busybox string
	// KernelRelease names /lib/modules/<release>, copied whole. Required.
	KernelRelease string
	// HostPrograms are dynamically linked host programs copied with the
	// libraries they load; default DefaultHostPrograms.
	HostPrograms []string
	// Out is the directory for the disk; created if missing. Required.
	Out string
}

// DefaultHostPrograms are the Debian programs a node runs: runc for
// containerd, iptables (nft and legacy) for kube-proxy, and dhcpcd for an
// IPv6 address by DHCPv6 (busybox's udhcpc is IPv4 only in Debian's build).
var DefaultHostPrograms = []string{"/usr/sbin/runc", "/usr/sbin/xtables-nft-multi", "/usr/sbin/xtables-legacy-multi", "/usr/sbin/dhcpcd"}

// xtablesDir holds iptables' extensions, loaded at run time (not in ldd).
const xtablesDir = "/usr/lib/x86_64-linux-gnu/xtables"

// Disk is a built root disk.
type Disk struct {
	// Path of the raw ext4 image.
	Path string
	// Key is the content hash of every input.
	Key string
	// Cached says the disk in Out already matched Key.
	Cached bool
}

// diskFile is one file of the disk: content from a host file or from memory.
type diskFile struct {
	src  string // host path, or "" when data is set
	data []byte
	mode fs.FileMode
	link string // symlink target
	dir  bool
	// unzstd says src is zstd-compressed and the disk holds it
	// decompressed.
	unzstd bool
}

// BuildRootDisk writes the node root disk into opts.Out, unless a disk built
// from identical inputs is there already.
func BuildRootDisk(ctx context.Context, opts DiskOptions) (Disk, error) {
	files, err := diskFiles(ctx, opts)
	if err != nil {
		return Disk{}, err
	}
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return Disk{}, fmt.Errorf("root disk output directory: %w", err)
	}
	sums := loadSums(filepath.Join(opts.Out, "node-root.sums"))
	key, err := diskKey(files, sums)
	if err != nil {
		return Disk{}, err
	}
	if err := sums.save(); err != nil {
		return Disk{}, err
	}
	d := Disk{Path: filepath.Join(opts.Out, "node-root.ext4"), Key: key}
	keyFile := filepath.Join(opts.Out, "node-root.key")
	if b, err := os.ReadFile(keyFile); err == nil && strings.TrimSpace(string(b)) == key && exists(d.Path) {
		d.Cached = true
		return d, nil
	}
	_ = os.Remove(keyFile) // the key goes last: a half-built disk is never reused
	stage := filepath.Join(opts.Out, "node-root.stage")
	_ = os.RemoveAll(stage)
	defer os.RemoveAll(stage)
	size, err := stageFiles(stage, files)
	if err != nil {
		return Disk{}, err
	}
	images, err := os.MkdirTemp("", "labcloud-images-")
	if err != nil {
		return Disk{}, err
	}
	defer os.RemoveAll(images)
	refs := nodeImageRefs()
	tars, err := WriteImages(images, opts, refs...)
	if err != nil {
		return Disk{}, err
	}
	if err := SeedContainerd(ctx, opts.Tools, tars, refs, filepath.Join(stage, SeedDir)); err != nil {
		return Disk{}, err
	}
	// ld.so.cache for the copied libraries (the host's would list libraries
	// the disk does not have).
	if out, err := exec.CommandContext(ctx, "ldconfig", "-r", stage).CombinedOutput(); err != nil {
		return Disk{}, fmt.Errorf("ldconfig -r %s: %w: %s", stage, err, out)
	}
	if err := mkfsExt4(ctx, stage, d.Path, size); err != nil {
		return Disk{}, err
	}
	return d, writeFileAtomic(keyFile, []byte(key+"\n"), 0o644)
}

// diskFiles lists every file of the disk except the container images.
func diskFiles(ctx context.Context, opts DiskOptions) (map[string]diskFile, error) {
	if opts.Tools == "" || opts.LabNode == "" || opts.KernelRelease == "" || opts.Out == "" {
		return nil, errors.New("image: DiskOptions.Tools, LabNode, KernelRelease and Out are required")
	}
	if opts.Busybox == "" {
		opts.Busybox = DefaultBusybox
	}
	if opts.HostPrograms == nil {
		opts.HostPrograms = DefaultHostPrograms
	}
	files := map[string]diskFile{}
	// Merged /usr, as on the host, so that library paths ldd prints exist.
	for _, l := range [][2]string{{"bin", "usr/bin"}, {"sbin", "usr/sbin"}, {"lib", "usr/lib"}, {"lib64", "usr/lib64"}} {
		files[l[0]] = diskFile{link: l[1]}
	}
	for _, d := range []string{"usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "dev", "proc", "sys", "run", "tmp", "root", "var/lib/kubelet", "var/log",
		"etc/cni/net.d", "etc/kubernetes/pki", "var/lib/kube-proxy", "usr/local/bin",
		"usr/lib/dhcpcd"} { // dhcpcd's privilege-separated chroot
		files[d] = diskFile{dir: true, mode: 0o755}
	}
	static := map[string]string{
		"usr/bin/busybox":                 opts.Busybox,
		"usr/bin/kubelet":                 filepath.Join(opts.Tools, "kubelet"),
		"usr/bin/kube-proxy":              filepath.Join(opts.Tools, "kube-proxy"),
		"usr/bin/containerd":              filepath.Join(opts.Tools, "containerd"),
		"usr/bin/containerd-shim-runc-v2": filepath.Join(opts.Tools, "containerd-shim-runc-v2"),
		"usr/bin/ctr":                     filepath.Join(opts.Tools, "ctr"),
		"usr/bin/lab-node":                opts.LabNode,
	}
	for _, p := range []string{"bridge", "host-local", "loopback", "portmap"} {
		static["opt/cni/bin/"+p] = filepath.Join(opts.Tools, "cni", p)
	}
	for dst, src := range static {
		if err := checkStatic(src, dst); err != nil {
			return nil, fmt.Errorf("%w (run hack/build-tools.sh)", err)
		}
		files[dst] = diskFile{src: src, mode: 0o755}
	}
	applets, err := busyboxApplets(ctx, opts.Busybox)
	if err != nil {
		return nil, err
	}
	for _, a := range applets {
		// On the disk's merged /usr, bin/sh is usr/bin/sh: one key per file.
		a = usrPath(clean(a))
		if _, taken := files[a]; !taken && a != "linuxrc" {
			files[a] = diskFile{link: "/usr/bin/busybox"}
		}
	}
	if err := addHostPrograms(ctx, files, opts.HostPrograms); err != nil {
		return nil, err
	}
	mods := filepath.Join("/lib/modules", opts.KernelRelease)
	if err := addModules(files, mods, "usr/lib/modules/"+opts.KernelRelease); err != nil {
		return nil, fmt.Errorf("kernel modules: %w", err)
	}
	err = fs.WalkDir(noderoot, "noderoot", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := noderoot.ReadFile(p)
		mode := fs.FileMode(0o644)
		if strings.HasPrefix(string(b), "#!") {
			mode = 0o755
		}
		files[strings.TrimPrefix(p, "noderoot/")] = diskFile{data: b, mode: mode}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("embedded node root: %w", err)
	}
	return files, nil
}

// addHostPrograms adds programs with the libraries ldd says they load, the
// iptables extensions and the command names xtables answers to.
func addHostPrograms(ctx context.Context, files map[string]diskFile, progs []string) error {
	bins := slices.Clone(progs)
	for _, p := range progs {
		if strings.HasSuffix(p, "/xtables-nft-multi") || strings.HasSuffix(p, "/xtables-legacy-multi") {
			ext, err := filepath.Glob(filepath.Join(xtablesDir, "*.so"))
			if err != nil || len(ext) == 0 {
				return fmt.Errorf("iptables extensions missing in %s; apt-get install iptables", xtablesDir)
			}
			bins = append(bins, ext...)
			break
		}
	}
	for _, b := range bins {
		real, err := filepath.EvalSymlinks(b)
		if err != nil {
			return fmt.Errorf("host program %s: %w (run hack/install-deps.sh)", b, err)
		}
		files[usrPath(b)] = diskFile{src: real, mode: 0o755}
		libs, err := sharedLibraries(ctx, b)
		if err != nil {
			return err
		}
		for _, l := range libs {
			real, err := filepath.EvalSymlinks(l)
			if err != nil {
				return fmt.Errorf("library %s of %s: %w", l, b, err)
			}
			files[usrPath(l)] = diskFile{src: real, mode: 0o755}
		}
	}
	for p, target := range xtablesLinks() {
		files[p] = diskFile{link: target}
	}
	return nil
}

// xtablesLinks are the command names kube-proxy runs, "iptables",
// "iptables-save", "iptables-restore" and the ip6tables ones, with the nft
// backend, as on Debian 12; and their -legacy names.
func xtablesLinks() map[string]string {
	links := map[string]string{}
	for _, n := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
		links["usr/sbin/"+n] = "xtables-nft-multi"
		links["usr/sbin/"+strings.Replace(n, "tables", "tables-legacy", 1)] = "xtables-legacy-multi"
	}
	return links
}

// usrPath maps a host path onto the disk's merged /usr.
func usrPath(p string) string {
	p = clean(p)
	for _, d := range []string{"bin/", "sbin/", "lib/", "lib64/"} {
		if strings.HasPrefix(p, d) {
			return "usr/" + p
		}
	}
	return p
}

var lddLine = regexp.MustCompile(`(?:=>\s*)?(/\S+)\s+\(0x`)

// sharedLibraries asks ldd which libraries (and loader) a program loads.
func sharedLibraries(ctx context.Context, prog string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ldd", prog).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", prog, err)
	}
	var libs []string
	for _, m := range lddLine.FindAllStringSubmatch(string(out), -1) {
		libs = append(libs, m[1])
	}
	return libs, nil
}

// addModules adds the kernel modules directory src at dst, every regular
// file and symlink. The nodes' busybox modprobe reads .ko, .ko.gz and
// .ko.xz but not .ko.zst (Ubuntu's): each .ko.zst goes onto the disk
// decompressed as .ko, and modules.dep, the one file of the directory
// busybox reads paths from, is rewritten to name them.
func addModules(files map[string]diskFile, src, dst string) error {
	zst := 0
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		key := path.Join(dst, filepath.ToSlash(rel))
		switch {
		case d.Type().IsRegular() && strings.HasSuffix(key, ".ko.zst"):
			files[strings.TrimSuffix(key, ".zst")] = diskFile{src: p, mode: 0o644, unzstd: true}
			zst++
		case d.Type().IsRegular():
			files[key] = diskFile{src: p, mode: 0o644}
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			files[key] = diskFile{link: target}
		}
		return nil
	})
	if err != nil || zst == 0 {
		return err
	}
	dep, err := os.ReadFile(filepath.Join(src, "modules.dep"))
	if err != nil {
		return fmt.Errorf("%d .ko.zst modules: %w", zst, err)
	}
	files[path.Join(dst, "modules.dep")] = diskFile{data: zstModulePath.ReplaceAll(dep, []byte(".ko")), mode: 0o644}
	return nil
}

// zstModulePath is the suffix of a .ko.zst path in modules.dep.
var zstModulePath = regexp.MustCompile(`\.ko\.zst\b`)

// diskKey hashes every file's path, mode and content (or link target), in
// path order, with the format version and the image recipes.
func diskKey(files map[string]diskFile, sums *sums) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", diskFormatVersion, imagesVersion)
	for _, p := range sortedKeys(files) {
		f := files[p]
		fmt.Fprintf(h, "%s %o %t %s\n", p, f.mode, f.dir, f.link)
		if f.unzstd {
			// The compressed content stands for the decompressed one
			// (zstd decodes one way), without decompressing it twice.
			io.WriteString(h, "unzstd\n")
		}
		switch {
		case f.link != "" || f.dir:
		case f.src != "":
			sum, err := sums.sum(f.src)
			if err != nil {
				return "", fmt.Errorf("root disk input: %w", err)
			}
			h.Write(sum)
		default:
			h.Write(f.data)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// stageFiles lays the files out under dir and returns their total size.
func stageFiles(dir string, files map[string]diskFile) (int64, error) {
	var total int64
	// Directories first, so that the merged-/usr links resolve when files
	// are written through them.
	keys := sortedKeys(files)
	slices.SortStableFunc(keys, func(a, b string) int {
		if files[a].dir == files[b].dir {
			return 0
		}
		if files[a].dir {
			return -1
		}
		return 1
	})
	for _, p := range keys {
		f := files[p]
		dst := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return 0, err
		}
		if f.dir {
			if err := os.MkdirAll(dst, f.mode); err != nil {
				return 0, err
			}
			continue
		}
		if f.link != "" {
			if err := os.Symlink(f.link, dst); err != nil {
				return 0, err
			}
			continue
		}
		// O_EXCL: never write through a symlink (an absolute one would
		// point into the host).
		w, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, f.mode)
		if err != nil {
			return 0, err
		}
		n, err := f.writeTo(w)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return 0, fmt.Errorf("root disk file %s: %w", p, err)
		}
		total += n
	}
	return total, nil
}

// writeTo writes the file's content to w, streaming from its host file.
func (f diskFile) writeTo(w io.Writer) (int64, error) {
	if f.src == "" {
		n, err := w.Write(f.data)
		return int64(n), err
	}
	r, err := os.Open(f.src)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	if f.unzstd {
		n, err := unzstd(w, r)
		if err != nil {
			err = fmt.Errorf("decompress %s: %w", f.src, err)
		}
		return n, err
	}
	return io.Copy(w, r)
}

// mkfsExt4 makes an ext4 image of dir at out, sized for its content with
// room for metadata; mke2fs -d copies the tree without mounting anything.
func mkfsExt4(ctx context.Context, dir, out string, content int64) error {
	var imgs int64
	_ = filepath.WalkDir(filepath.Join(dir, SeedDir), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				imgs += fi.Size()
			}
		}
		return nil
	})
	size := (content+imgs)*5/4 + 64<<20
	tmp := out + ".tmp"
	_ = os.Remove(tmp)
	if err := os.WriteFile(tmp, nil, 0o644); err != nil {
		return err
	}
	if err := os.Truncate(tmp, size); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-L", "labnode", "-m", "0", "-O", "^has_journal",
		"-E", "root_owner=0:0", "-d", dir, tmp)
	if b, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("mkfs.ext4 -d %s: %w: %s (apt-get install e2fsprogs)", dir, err, b)
	}
	return os.Rename(tmp, out)
}
