package up

import (
	"context"
	"path/filepath"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/image"
)

// BootImage builds the guests' kernel and initramfs, or takes them from
// the cache.
type BootImage struct {
	Artifacts image.Artifacts // made
}

func (a *BootImage) Execute(ctx context.Context, _ *Env) (err error) {
	a.Artifacts, err = image.Build(ctx, image.Options{Out: filepath.Join(lab.CacheDir(), "image")})
	return err
}
