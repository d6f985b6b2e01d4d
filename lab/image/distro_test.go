package image

import (
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// osRelease is the path of a real os-release file in testdata.
func osRelease(name string) string {
	return filepath.Join("testdata", "os-release", name)
}

func TestDistroOf(t *testing.T) {
	tests := []struct {
		file, pkg, glob string
	}{
		{"debian-12", "linux-image-cloud-amd64", "/boot/vmlinuz-*-cloud-amd64"},
		{"debian-13", "linux-image-cloud-amd64", "/boot/vmlinuz-*-cloud-amd64"},
		{"ubuntu-24.04", "linux-image-virtual", "/boot/vmlinuz-*-generic"},
	}
	for _, tc := range tests {
		d, err := DistroOf(osRelease(tc.file))
		if err != nil {
			t.Errorf("%s: %v", tc.file, err)
			continue
		}
		if d.KernelPackage != tc.pkg || d.KernelGlob != tc.glob {
			t.Errorf("%s: kernel %s at %s, want %s at %s", tc.file, d.KernelPackage, d.KernelGlob, tc.pkg, tc.glob)
		}
	}
	_, err := DistroOf(osRelease("fedora-41"))
	if !errors.Is(err, errUnknownDistro) || !strings.Contains(err.Error(), "ID=fedora VERSION_ID=41") {
		t.Errorf("fedora 41: error %v, want errUnknownDistro naming ID=fedora VERSION_ID=41", err)
	}
}

// TestInstallDepsPackages runs hack/install-deps.sh in its dry-run mode for
// each distribution's os-release: the exact package list, and the guest
// kernel package the image builder names in its errors.
func TestInstallDepsPackages(t *testing.T) {
	debian12 := []string{
		"build-essential", "pkg-config", "libvirt-dev",
		"libvirt-daemon", "libvirt-daemon-driver-qemu", "libvirt-daemon-config-network", "libvirt-clients",
		"qemu-system-x86", "dnsmasq-base", "iptables", "iproute2", "kmod", "tini",
		"busybox-static", "linux-image-cloud-amd64", "runc", "e2fsprogs", "dhcpcd-base",
		"xz-utils", "zstd",
		"curl", "wget", "netcat-openbsd", "iputils-ping", "ca-certificates", "bc", "procps",
		"bind9-dnsutils", "nginx",
		"mmdebstrap", "systemd-container", "frr",
		"jq", "git", "sudo", "podman",
		"openssh-server", "openssh-client",
	}
	for _, name := range []string{"debian-12", "debian-13", "ubuntu-24.04"} {
		d, err := DistroOf(osRelease(name))
		if err != nil {
			t.Fatal(err)
		}
		want := slices.Clone(debian12)
		want[slices.Index(want, "linux-image-cloud-amd64")] = d.KernelPackage
		out, _, err := installDepsDryRun(t, osRelease(name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if got := strings.Fields(out); !slices.Equal(got, want) {
			t.Errorf("%s: packages\n got %v\nwant %v", name, got, want)
		}
	}
	_, stderr, err := installDepsDryRun(t, osRelease("fedora-41"))
	if err == nil || !strings.Contains(stderr, "ID=fedora VERSION_ID=41") {
		t.Errorf("fedora 41: err %v, stderr %q; want a failure naming ID=fedora VERSION_ID=41", err, stderr)
	}
}

func installDepsDryRun(t *testing.T, osRelease string) (stdout, stderr string, err error) {
	t.Helper()
	abs, err := filepath.Abs(osRelease)
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(t.Context(), "bash", "../../hack/install-deps.sh")
	cmd.Env = append(os.Environ(), "INSTALL_DEPS_DRY_RUN=1", "OS_RELEASE="+abs)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// bootDir makes root/boot with empty kernel files of the given releases.
func bootDir(t *testing.T, releases ...string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "boot"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, r := range releases {
		if err := os.WriteFile(filepath.Join(root, "boot", "vmlinuz-"+r), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestFindKernelPerDistro(t *testing.T) {
	// What a host may hold at once: Debian's cloud kernels, Ubuntu's generic
	// ones, and the Azure kernel a GitHub runner boots.
	root := bootDir(t, "6.1.0-9-cloud-amd64", "6.1.0-56-cloud-amd64", "6.8.0-9-generic", "6.8.0-45-generic",
		"6.8.0-1017-azure")
	tests := []struct{ file, want string }{
		{"debian-12", "6.1.0-56-cloud-amd64"},
		{"debian-13", "6.1.0-56-cloud-amd64"},
		{"ubuntu-24.04", "6.8.0-45-generic"},
		// Unknown distribution: the running kernel's image.
		{"fedora-41", "6.8.0-1017-azure"},
	}
	for _, tc := range tests {
		got, err := findKernel(root, osRelease(tc.file), "6.8.0-1017-azure")
		if want := filepath.Join(root, "boot", "vmlinuz-"+tc.want); err != nil || got != want {
			t.Errorf("%s: findKernel = %q, %v; want %q", tc.file, got, err, want)
		}
	}

	empty := bootDir(t)
	for _, tc := range []struct{ file, want string }{
		{"debian-13", "apt-get install linux-image-cloud-amd64"},
		{"ubuntu-24.04", "apt-get install linux-image-virtual"},
		{"fedora-41", "ID=fedora VERSION_ID=41"},
	} {
		_, err := findKernel(empty, osRelease(tc.file), "6.8.0-1017-azure")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s without kernels: error %v, want one containing %q", tc.file, err, tc.want)
		}
	}
}

// modulesDir writes the real modules.dep and modules.builtin of a
// distribution's guest kernel (testdata/modules/NAME) into a directory,
// dropping modules.dep lines that name a module in drop.
func modulesDir(t *testing.T, name string, drop ...string) string {
	t.Helper()
	src := filepath.Join("testdata", "modules", name)
	gz, err := os.ReadFile(filepath.Join(src, "modules.dep.gz"))
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	var dep bytes.Buffer
	if _, err := dep.ReadFrom(zr); err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, l := range strings.Split(dep.String(), "\n") {
		file, _, _ := strings.Cut(l, ":")
		if !slices.Contains(drop, modName(file)) {
			kept = append(kept, l)
		}
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(strings.Join(kept, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	builtin, err := os.ReadFile(filepath.Join(src, "modules.builtin"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "modules.builtin"), builtin, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestGuestModulesInDistroKernels checks the module lists of the guest
// kernels Debian 12 and 13 ship: every module the guest loads is there,
// either as a file or built in; the builder says which is missing otherwise.
func TestGuestModulesInDistroKernels(t *testing.T) {
	for _, tc := range []struct {
		name    string
		load    []string // what the initramfs loads, in order
		builtin string   // a module the check must take as present
	}{
		{"debian-12", []string{"virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_ring", "virtio", "virtio_pci", "virtio_blk", "failover", "net_failover", "virtio_net", "overlay"}, "ext4"},
		{"debian-13", []string{"virtio_blk", "failover", "net_failover", "virtio_net", "overlay"}, "virtio_pci"},
	} {
		ix, err := readModuleIndex(modulesDir(t, tc.name))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !ix.builtin[tc.builtin] {
			t.Errorf("%s: %s not built in; the test's premise is wrong", tc.name, tc.builtin)
		}
		paths, err := ix.loadOrder(Modules)
		if err != nil {
			t.Errorf("%s: initramfs modules: %v", tc.name, err)
		}
		var names []string
		for _, p := range paths {
			names = append(names, modName(p))
		}
		if !slices.Equal(names, tc.load) {
			t.Errorf("%s: initramfs loads %v, want %v", tc.name, names, tc.load)
		}
		if _, err := ix.loadOrder(GuestModules); err != nil {
			t.Errorf("%s: node modules: %v", tc.name, err)
		}

		ix, err = readModuleIndex(modulesDir(t, tc.name, "br_netfilter"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ix.loadOrder(GuestModules); !errors.Is(err, errNoModule) || !strings.Contains(err.Error(), "br_netfilter") {
			t.Errorf("%s without br_netfilter: error %v, want errNoModule naming it", tc.name, err)
		}
	}
}

// TestGuestModulesAreWhatNodesLoad keeps GuestModules equal to the modules
// the node's rc script loads with modprobe.
func TestGuestModulesAreWhatNodesLoad(t *testing.T) {
	rc, err := noderoot.ReadFile("noderoot/etc/lab-init/rc")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`for m in ([^;]+); do\s+modprobe "\$m"`).FindSubmatch(rc)
	if m == nil {
		t.Fatal(`rc has no "for m in ...; do modprobe" loop`)
	}
	want := strings.Fields(string(m[1]))
	if !slices.Equal(GuestModules, want) {
		t.Errorf("GuestModules = %v, rc loads %v", GuestModules, want)
	}
}
