package systemdroot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// Suite is the Debian release of every root.
	Suite = "bookworm"
	// DefaultCacheDir holds built roots, outside any checkout.
	DefaultCacheDir = "/var/cache/labcloud/systemd-root"
	// formatVersion is part of the cache key: bump it when a change to the
	// build changes the resulting root, so old roots are not reused.
	formatVersion = "1"
)

// BasePackages are in every root: systemd as init, D-Bus for systemctl, ip(8)
// and libvirt's client library for our binary.
var BasePackages = []string{"systemd", "systemd-sysv", "dbus", "iproute2", "libvirt0"}

var pkgName = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+(:[a-z0-9]+)?$`)

// Root returns a Debian bookworm root (minbase plus BasePackages and
// extraPackages) cached under cacheDir (DefaultCacheDir if empty), building it
// with mmdebstrap on first use. The directory is shared: never write to it;
// Boot works on an overlay or a copy.
func Root(ctx context.Context, cacheDir string, extraPackages []string) (string, error) {
	if cacheDir == "" {
		cacheDir = DefaultCacheDir
	}
	pkgs := slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(BasePackages), extraPackages...))))
	for _, p := range pkgs {
		if !pkgName.MatchString(p) {
			return "", fmt.Errorf("systemd root: bad package name %q", p)
		}
	}
	sum := sha256.Sum256([]byte(formatVersion + "\n" + Suite + "\n" + strings.Join(pkgs, "\n")))
	final := filepath.Join(cacheDir, Suite+"-"+hex.EncodeToString(sum[:8]))
	if isDir(final) {
		return final, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("systemd root cache: %w", err)
	}
	// One builder per key; others wait and then find the result.
	unlock, err := lockFile(ctx, final+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if isDir(final) {
		return final, nil
	}
	if err := build(ctx, final, pkgs); err != nil {
		return "", err
	}
	return final, nil
}

// build runs mmdebstrap into a temporary sibling of final and renames it into
// place, so a root that exists is complete. The caller holds final's lock.
func build(ctx context.Context, final string, pkgs []string) error {
	stale, _ := filepath.Glob(final + ".tmp-*") // left by a killed build
	for _, s := range stale {
		if err := removeAll(s); err != nil {
			return fmt.Errorf("systemd root: stale build: %w", err)
		}
	}
	if err := InstallMissing(ctx, "mmdebstrap"); err != nil {
		return fmt.Errorf("systemd root: %w", err)
	}
	mirrors, err := HostSources(Suite)
	if err != nil {
		return fmt.Errorf("systemd root: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(final), filepath.Base(final)+".tmp-")
	if err != nil {
		return fmt.Errorf("systemd root: %w", err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("systemd root: %w", err)
	}
	args := append([]string{"--mode=root", "--variant=minbase",
		"--include=" + strings.Join(pkgs, ","),
		// No fsync per unpacked file while building (159 s against 200 s
		// once, on a loaded host); the setting is not left in the root.
		"--dpkgopt=force-unsafe-io",
		`--customize-hook=rm "$1"/etc/dpkg/dpkg.cfg.d/99mmdebstrap`,
		Suite, tmp}, mirrors...)
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	// On cancel, SIGTERM the whole group (apt, dpkg in the chroot) so that
	// mmdebstrap cleans up and exits; it ignores a lone SIGTERM until the
	// current phase ends. Whatever is left after 30 s gets SIGKILL.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		killGroup(cmd.Process.Pid) // else orphans keep writing into tmp
		rmErr := removeAll(tmp)
		return fmt.Errorf("systemd root: mmdebstrap %s: %w: %s (cleanup: %v)",
			strings.Join(args, " "), err, tail(out.Bytes()), rmErr)
	}
	if err := os.Rename(tmp, final); err != nil {
		rmErr := removeAll(tmp)
		return fmt.Errorf("systemd root: %w (cleanup: %v)", err, rmErr)
	}
	return nil
}

// killGroup SIGKILLs process group pgid and waits (up to 10 s) until it is
// empty. A group that still has members keeps its ID, so this cannot hit a
// stranger.
func killGroup(pgid int) {
	for i := 0; i < 100 && syscall.Kill(-pgid, syscall.SIGKILL) == nil; i++ {
		time.Sleep(100 * time.Millisecond)
	}
}

// lockFile takes an exclusive flock on path, polling so ctx can end the wait.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if err != unix.EWOULDBLOCK {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}
