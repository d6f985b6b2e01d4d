// Package version is labcloud's own version, stamped at build time from
// `git describe` (hack/version.sh) by the Makefile's -ldflags.
package version

// stamped is set with -ldflags "-X github.com/labcloud/labcloud/version.stamped=...".
var stamped string

// Get returns the version the binary was built as, or "unknown" for a
// plain `go build` (never a made-up number).
func Get() string {
	if stamped == "" {
		return "unknown"
	}
	return stamped
}
