package up

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/labcloud/labcloud/lab"
)

// Binaries finds the CCM and lab-node: next to this executable when they
// are there (make build), else built from the checkout.
type Binaries struct {
	CCM, LabNode string // made: the binaries' paths
}

func (a *Binaries) Execute(ctx context.Context, env *Env) (err error) {
	a.CCM, a.LabNode, err = ensureBinaries(ctx, env.repo())
	return err
}

// ensureBinaries returns the CCM and lab-node binaries: next to this
// executable when they are there (make build), else built from repo.
func ensureBinaries(ctx context.Context, repo string) (ccm, labNode string, err error) {
	if exe, err := os.Executable(); err == nil {
		dir := filepath.Dir(exe)
		c, n := filepath.Join(dir, "libvirt-cloud-controller-manager"), filepath.Join(dir, "lab-node")
		if isFile(c) && isFile(n) {
			return c, n, nil
		}
	}
	if !isFile(filepath.Join(repo, "go.mod")) {
		return "", "", fmt.Errorf("libvirt-cloud-controller-manager and lab-node are not next to labcloud and %s is no checkout to build them from", repo)
	}
	bin := filepath.Join(lab.CacheDir(), "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", "", err
	}
	// make build stamps the version, as for every binary users run.
	build := exec.CommandContext(ctx, "make", "-s", "build", "BIN="+bin)
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("make build: %w: %s", err, out)
	}
	return filepath.Join(bin, "libvirt-cloud-controller-manager"), filepath.Join(bin, "lab-node"), nil
}

// FindCCMBinary returns the CCM binary up would run when one is already
// built (next to this executable, or in the cache), without building it.
func FindCCMBinary() (string, bool) {
	var dirs []string
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Dir(exe))
	}
	for _, d := range append(dirs, filepath.Join(lab.CacheDir(), "bin")) {
		if p := filepath.Join(d, "libvirt-cloud-controller-manager"); isFile(p) {
			return p, true
		}
	}
	return "", false
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}
