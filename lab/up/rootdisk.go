package up

import (
	"context"
	"path/filepath"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/image"
)

// RootDisk builds the nodes' root disk, with the Kubernetes tools,
// lab-node and the boot kernel's modules, or takes it from the cache.
type RootDisk struct {
	Tools    *Tools
	Binaries *Binaries  // lab-node
	Image    *BootImage // the kernel's release
	Disk     image.Disk // made
}

func (a *RootDisk) Execute(ctx context.Context, env *Env) (err error) {
	a.Disk, err = image.BuildRootDisk(ctx, image.DiskOptions{
		Tools: a.Tools.Dir, LabNode: a.Binaries.LabNode, KernelRelease: a.Image.Artifacts.KernelRelease, Out: filepath.Join(lab.CacheDir(), "image"),
	})
	if err == nil && !a.Disk.Cached {
		env.say("built %s", a.Disk.Path)
	}
	return err
}
