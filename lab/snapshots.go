package lab

import (
	"path/filepath"

	"github.com/labcloud/labcloud/lab/snapshot"
)

// Snapshots is the store of booted labs, in the cache: they outlive the
// lab, as the image does.
func Snapshots() snapshot.Store { return snapshot.Store{Dir: filepath.Join(CacheDir(), "snapshots")} }
