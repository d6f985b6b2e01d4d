package image

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// fakeModulesTree makes /lib/modules/<release> as Ubuntu 24.04 ships it:
// bridge and veth zstd-compressed, llc plain, modules.dep naming the files
// as they are. It returns the tree and each module's uncompressed bytes.
func fakeModulesTree(t *testing.T, release string) (string, map[string][]byte) {
	t.Helper()
	src := filepath.Join(t.TempDir(), release)
	mods := map[string][]byte{
		"kernel/net/bridge/bridge.ko": []byte("\x7fELF bridge " + strings.Repeat("b", 4096)),
		"kernel/net/llc/llc.ko":       []byte("\x7fELF llc"),
		"kernel/drivers/net/veth.ko":  []byte("\x7fELF veth " + strings.Repeat("v", 100)),
	}
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	write := func(rel string, b []byte) {
		p := filepath.Join(src, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for rel, b := range mods {
		if strings.HasSuffix(rel, "/llc.ko") {
			write(rel, b)
		} else {
			write(rel+".zst", enc.EncodeAll(b, nil))
		}
	}
	write("modules.dep", []byte("kernel/net/bridge/bridge.ko.zst: kernel/net/llc/llc.ko\n"+
		"kernel/net/llc/llc.ko:\n"+
		"kernel/drivers/net/veth.ko.zst:\n"))
	write("modules.builtin", []byte("kernel/fs/ext4/ext4.ko\n"))
	return src, mods
}

// TestZstdModulesOnDisk: busybox modprobe cannot read .ko.zst, so the disk
// holds each one decompressed as .ko, and modules.dep names the .ko.
func TestZstdModulesOnDisk(t *testing.T) {
	src, mods := fakeModulesTree(t, "6.8.0-31-generic")
	files := map[string]diskFile{}
	if err := addModules(files, src, "usr/lib/modules/6.8.0-31-generic"); err != nil {
		t.Fatal(err)
	}
	stage := filepath.Join(t.TempDir(), "stage")
	if _, err := stageFiles(stage, files); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(stage, "usr/lib/modules/6.8.0-31-generic")
	for rel, want := range mods {
		got, err := os.ReadFile(filepath.Join(dir, rel))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s on the disk: %d bytes, %v; want the %d uncompressed bytes", rel, len(got), err, len(want))
		}
		if _, err := os.Lstat(filepath.Join(dir, rel+".zst")); err == nil {
			t.Errorf("%s.zst is on the disk too", rel)
		}
	}
	dep, err := os.ReadFile(filepath.Join(dir, "modules.dep"))
	wantDep := "kernel/net/bridge/bridge.ko: kernel/net/llc/llc.ko\n" +
		"kernel/net/llc/llc.ko:\n" +
		"kernel/drivers/net/veth.ko:\n"
	if err != nil || string(dep) != wantDep {
		t.Errorf("modules.dep on the disk = %q, %v; want %q", dep, err, wantDep)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err != nil || string(b) != "kernel/fs/ext4/ext4.ko\n" {
		t.Errorf("modules.builtin on the disk = %q, %v; want it unchanged", b, err)
	}
}

// TestModulesDiskKey: the key follows a compressed module's content, and a
// tree without .zst (Debian's) is taken as it is, file by file.
func TestModulesDiskKey(t *testing.T) {
	src, _ := fakeModulesTree(t, "6.8.0-31-generic")
	key := func() string {
		t.Helper()
		files := map[string]diskFile{}
		if err := addModules(files, src, "m"); err != nil {
			t.Fatal(err)
		}
		k, err := diskKey(files, loadSums(""))
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	before := key()
	enc, _ := zstd.NewWriter(nil)
	defer enc.Close()
	veth := filepath.Join(src, "kernel/drivers/net/veth.ko.zst")
	if err := os.WriteFile(veth, enc.EncodeAll([]byte("\x7fELF veth, rebuilt"), nil), 0o644); err != nil {
		t.Fatal(err)
	}
	if before == key() {
		t.Error("disk key unchanged after veth.ko.zst changed")
	}

	plain := t.TempDir()
	for rel, b := range map[string]string{"kernel/net/veth.ko": "\x7fELF", "kernel/net/llc.ko.xz": "xz", "modules.dep": "kernel/net/veth.ko:\nkernel/net/llc.ko.xz:\n"} {
		p := filepath.Join(plain, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]diskFile{}
	if err := addModules(files, plain, "m"); err != nil {
		t.Fatal(err)
	}
	for p, f := range files {
		if want := filepath.Join(plain, strings.TrimPrefix(p, "m/")); f.src != want || f.data != nil {
			t.Errorf("%s: from %q (%d bytes in memory), want the host file %s as it is", p, f.src, len(f.data), want)
		}
	}
	if len(files) != 3 {
		t.Errorf("%d files, want 3: %v", len(files), files)
	}
}

// TestBusyboxModprobeFindsDecompressed runs the host's busybox modprobe -D
// in a chroot of the staged modules: it must name .ko files that hold the
// modules' bytes, dependencies first.
func TestBusyboxModprobeFindsDecompressed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for chroot")
	}
	if _, err := os.Stat(DefaultBusybox); err != nil {
		t.Skipf("no busybox: %v (apt-get install busybox-static)", err)
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(uts.Release[:]) // busybox modprobe looks in /lib/modules/$(uname -r)
	src, mods := fakeModulesTree(t, release)
	files := map[string]diskFile{
		"lib":             {link: "usr/lib"},
		"usr/bin/busybox": {src: DefaultBusybox, mode: 0o755},
	}
	if err := addModules(files, src, "usr/lib/modules/"+release); err != nil {
		t.Fatal(err)
	}
	stage := filepath.Join(t.TempDir(), "stage")
	if _, err := stageFiles(stage, files); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), "chroot", stage, "/usr/bin/busybox", "modprobe", "-D", "bridge").CombinedOutput()
	if err != nil {
		t.Fatalf("busybox modprobe -D bridge: %v: %s", err, out)
	}
	want := []string{"kernel/net/llc/llc.ko", "kernel/net/bridge/bridge.ko"}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(want) {
		t.Fatalf("busybox modprobe -D bridge:\n%s\nwant insmod of %v", out, want)
	}
	for i, l := range lines {
		p, ok := strings.CutPrefix(strings.TrimSpace(l), "insmod /lib/modules/"+release+"/")
		if !ok || p != want[i] {
			t.Errorf("line %d: %q, want insmod of %s", i, l, want[i])
			continue
		}
		if got, err := os.ReadFile(filepath.Join(stage, "lib/modules", release, p)); err != nil || !bytes.Equal(got, mods[p]) {
			t.Errorf("%s: %d bytes, %v; want the module's %d uncompressed bytes", p, len(got), err, len(mods[p]))
		}
	}
}
