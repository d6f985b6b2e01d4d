package systemdroot

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
)

// aptMu serializes our own apt-get runs; dpkg's lock (waited on below)
// covers other processes.
var aptMu sync.Mutex

// InstallMissing installs those of pkgs that are not installed on the host,
// noninteractively and without recommends. It runs apt-get update only if the
// first attempt fails (the package lists may be missing or stale).
func InstallMissing(ctx context.Context, pkgs ...string) error {
	aptMu.Lock()
	defer aptMu.Unlock()
	var missing []string
	for _, p := range pkgs {
		if !installed(ctx, p) {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	install := append([]string{"install", "-y", "--no-install-recommends"}, missing...)
	out, err := aptGet(ctx, install...)
	if err == nil {
		return nil
	}
	if uout, uerr := aptGet(ctx, "update"); uerr != nil {
		return fmt.Errorf("apt-get install %s: %w: %s; then apt-get update: %w: %s",
			strings.Join(missing, " "), err, tail(out), uerr, tail(uout))
	}
	if out, err = aptGet(ctx, install...); err != nil {
		return fmt.Errorf("apt-get install %s: %w: %s", strings.Join(missing, " "), err, tail(out))
	}
	return nil
}

func installed(ctx context.Context, pkg string) bool {
	out, err := exec.CommandContext(ctx, "dpkg-query", "-W", "-f=${db:Status-Abbrev}", pkg).Output()
	return err == nil && strings.HasPrefix(string(out), "ii")
}

func aptGet(ctx context.Context, args ...string) ([]byte, error) {
	// Wait for dpkg's lock instead of failing when another apt runs.
	args = append([]string{"-q", "-o", "DPkg::Lock::Timeout=300"}, args...)
	cmd := exec.CommandContext(ctx, "apt-get", args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	return buf.Bytes(), err
}

// tail returns the last lines of a command's output for error messages.
func tail(b []byte) string {
	const max = 2000
	s := strings.TrimSpace(string(b))
	if len(s) > max {
		s = "..." + s[len(s)-max:]
	}
	return s
}
