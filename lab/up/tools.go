package up

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/labcloud/labcloud/lab/controlplane"
)

// Tools finds the control-plane binaries (etcd, the Kubernetes daemons,
// kubectl, CoreDNS) and records their directory in the state.
type Tools struct {
	Dir string // made: the binaries' directory
}

func (a *Tools) Execute(ctx context.Context, env *Env) (err error) {
	a.Dir, err = ensureTools(ctx, env.repo(), env.Opts.Out)
	env.State.Tools = a.Dir
	return err
}

// ensureTools returns the control-plane binaries' directory. From a
// checkout it runs hack/build-tools.sh, which builds what is missing or
// stale (CoreDNS's plugins change with the lab) and is a no-op otherwise;
// without one it takes the installed tools as they are.
func ensureTools(ctx context.Context, repo string, out io.Writer) (string, error) {
	script := filepath.Join(repo, "hack", "build-tools.sh")
	if _, err := os.Stat(script); err != nil {
		// A cache built before CoreDNS and porter's TLS pair joined lacks those.
		if d, err := controlplane.FindTools(); err == nil && isFile(filepath.Join(d, "coredns")) && isFile(filepath.Join(d, "porter", "localhost.key")) {
			return d, nil
		}
		return "", fmt.Errorf("control-plane binaries missing and no labcloud checkout to build them from (%s): run make tools", script)
	}
	cmd := exec.CommandContext(ctx, script)
	cmd.Stderr = out
	if os.Getenv("LABCLOUD_E2E") == "" { // up needs neither e2e.test nor Ginkgo
		cmd.Env = append(os.Environ(), "LABCLOUD_E2E=false")
	}
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w", script, err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1], nil
}
