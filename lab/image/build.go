package image

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// LabNodePackage is the import path of the lab-node command.
const LabNodePackage = "github.com/labcloud/labcloud/cmd/lab-node"

// BuildLabNode compiles a static lab-node for linux/amd64 into out with the
// go command, run in dir (any directory inside the labcloud module).
func BuildLabNode(ctx context.Context, dir, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, LabNodePackage)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w: %s", LabNodePackage, err, strings.TrimSpace(string(b)))
	}
	return nil
}
