// Package action runs action.yml the way GitHub's runner does (runner_test.go
// emulates the runner), then a user's next steps against the lab it made;
// and checks the pieces the Action stands on without a lab.
package action

import (
	"path/filepath"
	"runtime"
)

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}
