package image

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// FindKernel returns the guest kernel for this host: the newest kernel the
// distribution's guest kernel package installed (Distro.KernelGlob). On a
// distribution hack/install-deps.sh does not know it falls back to the
// running kernel's image, whose modules are the host's own.
func FindKernel() (string, error) {
	running, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "", fmt.Errorf("running kernel: %w", err)
	}
	return findKernel("/", hostOSRelease(), strings.TrimSpace(string(running)))
}

// findKernel is FindKernel with /boot under root.
func findKernel(root, osRelease, running string) (string, error) {
	d, err := DistroOf(osRelease)
	if errors.Is(err, errUnknownDistro) {
		p := filepath.Join(root, "boot", "vmlinuz-"+running)
		if !exists(p) {
			return "", fmt.Errorf("no guest kernel: %w, and the running kernel's image %s is missing", err, p)
		}
		return p, nil
	}
	if err != nil {
		return "", err
	}
	glob := filepath.Join(root, d.KernelGlob)
	paths, err := filepath.Glob(glob)
	if err != nil {
		return "", fmt.Errorf("find kernel: %w", err)
	}
	if len(paths) == 0 {
		return "", fmt.Errorf("no guest kernel: %s missing; apt-get install %s (hack/install-deps.sh)", glob, d.KernelPackage)
	}
	slices.SortFunc(paths, func(a, b string) int {
		return compareVersions(strings.TrimPrefix(filepath.Base(a), "vmlinuz-"), strings.TrimPrefix(filepath.Base(b), "vmlinuz-"))
	})
	return paths[len(paths)-1], nil
}

// compareVersions orders kernel release strings: runs of digits compare as
// numbers, everything else as text ("6.1.0-10" < "6.1.0-9" is false).
func compareVersions(a, b string) int {
	for a != "" && b != "" {
		ra, restA := versionRun(a)
		rb, restB := versionRun(b)
		if c := compareRun(ra, rb); c != 0 {
			return c
		}
		a, b = restA, restB
	}
	return strings.Compare(a, b)
}

func versionRun(s string) (run, rest string) {
	digit := s[0] >= '0' && s[0] <= '9'
	i := 1
	for i < len(s) && (s[i] >= '0' && s[i] <= '9') == digit {
		i++
	}
	return s[:i], s[i:]
}

func compareRun(a, b string) int {
	na, errA := strconv.ParseUint(a, 10, 64)
	nb, errB := strconv.ParseUint(b, 10, 64)
	if errA == nil && errB == nil {
		switch {
		case na < nb:
			return -1
		case na > nb:
			return 1
		}
		return 0
	}
	if errA == nil { // digits sort before text
		return -1
	}
	if errB == nil {
		return 1
	}
	return strings.Compare(a, b)
}

// KernelVersion reads the release (uname -r) of an x86 bzImage from its
// setup header; for other files it falls back to the name vmlinuz-<release>.
func KernelVersion(kernel string) (string, error) {
	data, err := os.ReadFile(kernel)
	if err != nil {
		return "", fmt.Errorf("read kernel: %w", err)
	}
	if v := bzImageVersion(data); v != "" {
		return v, nil
	}
	if v, ok := strings.CutPrefix(filepath.Base(kernel), "vmlinuz-"); ok && v != "" {
		return v, nil
	}
	return "", fmt.Errorf("kernel %s: no version in its header or name", kernel)
}

// bzImageVersion parses the boot protocol header: "HdrS" at 0x202 and the
// kernel_version pointer at 0x20e, relative to 0x200.
func bzImageVersion(data []byte) string {
	if len(data) < 0x210 || string(data[0x202:0x206]) != "HdrS" {
		return ""
	}
	off := int(binary.LittleEndian.Uint16(data[0x20e:])) + 0x200
	if off <= 0x200 || off >= len(data) {
		return ""
	}
	s := data[off:min(len(data), off+256)]
	if i := bytes.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	v, _, _ := strings.Cut(string(s), " ")
	return v
}

// checkStatic fails unless path is a statically linked x86-64 ELF program:
// the initramfs has no dynamic loader and no libraries.
func checkStatic(path, what string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, path, err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("%s %s: built for %s, want x86-64", what, path, f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s %s: %w", what, path, errDynamic)
		}
	}
	return nil
}

var errDynamic = errors.New("dynamically linked; the guest needs a static binary")
