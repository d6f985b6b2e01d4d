package guide

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/labcloud/labcloud/lab/image"
	"github.com/labcloud/labcloud/test/systemdroot"
)

// guestPackages make a Debian bookworm guest what a user's cloud image is
// once kubernetes.io's "Installing kubeadm" steps are done: a kernel that
// boots from its own initrd, sshd, and what kubeadm's preflight checks and
// kube-proxy exec. containerd, runc's shim, the CNI plugins, kubelet,
// kubeadm and kubectl come from our own builds at v1.36.3 (Debian has none
// of them at that version).
var guestPackages = []string{
	"linux-image-cloud-amd64", "initramfs-tools", "openssh-server", "iptables", "nftables",
	"conntrack", "ethtool", "socat", "runc", "ca-certificates", "kmod", "procps",
}

// guestFormat changes whenever the disk's recipe does (part of its key).
const guestFormat = "guide-guest/2"

// guestImages are seeded into the guest's containerd, under upstream's
// names: what kubeadm runs, and the guide's web Deployment. Nothing is
// pulled (the guests have no internet).
func guestImages() []string { return append(image.KubeadmImages(), image.AgnhostImage) }

// imageTools are the binaries of the images, part of the disk's key.
var imageTools = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "etcd", "coredns", "pause", "agnhost"}

// guestImage is the guests' base disk (raw ext4, no partition table), the
// kernel and initrd they boot directly, and the key sshd trusts for root.
type guestImage struct {
	Dir, Disk, Kernel, Initrd, Key string
}

// guestTools are the binaries of hack/build-tools.sh a guest carries, and
// where.
var guestTools = map[string]string{
	"kubelet": "/usr/bin/kubelet", "kubeadm": "/usr/bin/kubeadm", "kubectl": "/usr/bin/kubectl",
	"containerd": "/usr/bin/containerd", "containerd-shim-runc-v2": "/usr/bin/containerd-shim-runc-v2", "ctr": "/usr/bin/ctr",
	"cni/bridge": "/opt/cni/bin/bridge", "cni/host-local": "/opt/cni/bin/host-local",
	"cni/loopback": "/opt/cni/bin/loopback", "cni/portmap": "/opt/cni/bin/portmap",
}

// buildGuestImage returns the base image for tools, building it under
// cacheDir on first use (keyed by the Debian root, the tools' content and
// the recipe).
func buildGuestImage(ctx context.Context, cacheDir, tools string) (guestImage, error) {
	root, err := systemdroot.Root(ctx, "", guestPackages)
	if err != nil {
		return guestImage{}, err
	}
	key, err := guestKey(root, tools)
	if err != nil {
		return guestImage{}, err
	}
	dir := filepath.Join(cacheDir, "guide-guest-"+key)
	img := guestImage{Dir: dir, Disk: filepath.Join(dir, "disk.raw"), Kernel: filepath.Join(dir, "vmlinuz"),
		Initrd: filepath.Join(dir, "initrd.img"), Key: filepath.Join(dir, "id_ed25519")}
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		return img, nil
	}
	// One image is kept: those of other keys (older tools or recipes) go.
	stale, _ := filepath.Glob(filepath.Join(cacheDir, "guide-guest-*"))
	for _, d := range stale {
		if err := os.RemoveAll(d); err != nil {
			return guestImage{}, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return guestImage{}, err
	}
	tree := dir + ".tree"
	defer os.RemoveAll(tree)
	if out, err := exec.CommandContext(ctx, "cp", "-a", root, tree).CombinedOutput(); err != nil {
		return guestImage{}, fmt.Errorf("copy the guest root: %v: %s", err, out)
	}
	if out, err := exec.CommandContext(ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "guide", "-f", img.Key).CombinedOutput(); err != nil {
		return guestImage{}, fmt.Errorf("ssh-keygen: %v: %s", err, out)
	}
	pub, err := os.ReadFile(img.Key + ".pub")
	if err != nil {
		return guestImage{}, err
	}
	if err := customizeGuest(tree, tools, pub); err != nil {
		return guestImage{}, err
	}
	tars, err := image.WriteImages(dir+".images", image.DiskOptions{Tools: tools}, guestImages()...)
	defer os.RemoveAll(dir + ".images")
	if err != nil {
		return guestImage{}, err
	}
	if err := image.SeedContainerd(ctx, tools, tars, guestImages(), filepath.Join(tree, "var/lib/containerd")); err != nil {
		return guestImage{}, err
	}
	kernels, _ := filepath.Glob(filepath.Join(tree, "boot", "vmlinuz-*"))
	initrds, _ := filepath.Glob(filepath.Join(tree, "boot", "initrd.img-*"))
	if len(kernels) != 1 || len(initrds) != 1 {
		return guestImage{}, fmt.Errorf("guest root: want one kernel and one initrd in /boot, have %v and %v", kernels, initrds)
	}
	for src, dst := range map[string]string{kernels[0]: img.Kernel, initrds[0]: img.Initrd} {
		if err := copyFile(src, dst, 0o644); err != nil {
			return guestImage{}, err
		}
	}
	// Sparse: the guests' own writes (images, etcd, logs) go to their copies.
	if out, err := exec.CommandContext(ctx, "mke2fs", "-q", "-t", "ext4", "-L", "root", "-d", tree, img.Disk, "8G").CombinedOutput(); err != nil {
		return guestImage{}, fmt.Errorf("mke2fs: %v: %s", err, out)
	}
	return img, os.WriteFile(filepath.Join(dir, ".complete"), nil, 0o644)
}

// guestKey hashes what the image is made of.
func guestKey(root, tools string) (string, error) {
	h := sha256.New()
	fmt.Fprintln(h, guestFormat, filepath.Base(root))
	names := slices.Clone(imageTools)
	for n := range guestTools {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(h, guestImages())
	for _, n := range names {
		f, err := os.Open(filepath.Join(tools, n))
		if err != nil {
			return "", fmt.Errorf("%w (LABCLOUD_KUBEADM=true hack/build-tools.sh builds it)", err)
		}
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", err
		}
	}
	for _, f := range guestFiles(nil) {
		fmt.Fprintln(h, f.path, f.mode, f.data)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

type guestFile struct {
	path string
	mode os.FileMode
	data string
}

// guestFiles are the files a guest has besides its packages and tools:
// what a cloud image and kubeadm's packages would bring.
func guestFiles(authorizedKey []byte) []guestFile {
	return []guestFile{
		{"/etc/fstab", 0o644, "/dev/vda / ext4 defaults 0 1\n"},
		// DHCP on the NIC (the kernel's name, eth0: net.ifnames=0).
		{"/etc/systemd/network/10-eth0.network", 0o644, "[Match]\nName=eth0\n\n[Network]\nDHCP=yes\n"},
		// libvirt's dnsmasq on the stock network answers DNS.
		{"/etc/resolv.conf", 0o644, "nameserver 192.168.122.1\n"},
		{"/root/.ssh/authorized_keys", 0o600, string(authorizedKey)},
		{"/etc/systemd/system/containerd.service", 0o644, containerdUnit},
		{"/etc/systemd/system/kubelet.service", 0o644, kubeletUnit},
		{"/etc/systemd/system/kubelet.service.d/10-kubeadm.conf", 0o644, kubeadmDropIn},
	}
}

// containerdUnit runs containerd as its own project's unit does.
const containerdUnit = `[Unit]
Description=containerd container runtime
After=network.target local-fs.target

[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/bin/containerd
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNOFILE=infinity
TasksMax=infinity
OOMScoreAdjust=-999

[Install]
WantedBy=multi-user.target
`

// kubeletUnit and kubeadmDropIn are what Kubernetes' kubelet and kubeadm
// packages install: the kubelet restarts until kubeadm has written its
// configuration, then runs with kubeadm's flags.
const kubeletUnit = `[Unit]
Description=kubelet: The Kubernetes Node Agent
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
`

const kubeadmDropIn = `[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
`

// guestUnits are enabled in multi-user.target, as their packages' install
// scripts would.
var guestUnits = []string{"containerd.service", "kubelet.service", "systemd-networkd.service"}

// customizeGuest adds the tools, the files and the enabled units to tree.
func customizeGuest(tree, tools string, authorizedKey []byte) error {
	for src, dst := range guestTools {
		if err := copyFile(filepath.Join(tools, src), filepath.Join(tree, dst), 0o755); err != nil {
			return err
		}
	}
	for _, f := range guestFiles(authorizedKey) {
		p := filepath.Join(tree, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		_ = os.Remove(p) // resolv.conf may be a link
		if err := os.WriteFile(p, []byte(f.data), f.mode); err != nil {
			return err
		}
	}
	wants := filepath.Join(tree, "etc/systemd/system/multi-user.target.wants")
	if err := os.MkdirAll(wants, 0o755); err != nil {
		return err
	}
	for _, u := range guestUnits {
		target := "/etc/systemd/system/" + u
		if strings.HasPrefix(u, "systemd-") {
			target = "/lib/systemd/system/" + u
		}
		_ = os.Remove(filepath.Join(wants, u))
		if err := os.Symlink(target, filepath.Join(wants, u)); err != nil {
			return err
		}
	}
	return nil
}

// copyFile copies src to dst (its directories made) with mode.
func copyFile(src, dst string, mode os.FileMode) error {
	if out, err := exec.Command("install", "-D", "-m", fmt.Sprintf("%o", mode), src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("install %s %s: %v: %s", src, dst, err, out)
	}
	return nil
}
