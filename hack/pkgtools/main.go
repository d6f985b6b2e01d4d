// Command nfpm-deb builds the Debian package of the CCM with nfpm
// (github.com/goreleaser/nfpm/v2) used as a library: `make deb` runs it.
// Only nfpm's deb packager is linked in; nfpm's own command also links its
// rpm packager, whose dependencies the module proxy does not serve.
//
// Usage: nfpm-deb -f packaging/nfpm.yaml -t dist/
// The config's ${VAR} references (version, binary path) come from the
// environment, as with the nfpm command.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
)

func main() {
	config := flag.String("f", "nfpm.yaml", "nfpm config file")
	target := flag.String("t", ".", "directory the package is written to")
	flag.Parse()
	path, err := build(*config, *target)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nfpm-deb:", err)
		os.Exit(1)
	}
	fmt.Println(path)
}

// build writes the package into dir under deb's conventional file name
// (name_version_arch.deb) and returns its path.
func build(config, dir string) (string, error) {
	cfg, err := nfpm.ParseFile(config)
	if err != nil {
		return "", fmt.Errorf("parse %s: %w", config, err)
	}
	info, err := cfg.Get("deb")
	if err != nil {
		return "", err
	}
	info = nfpm.WithDefaults(info)
	if err := nfpm.Validate(info); err != nil {
		return "", fmt.Errorf("%s: %w", config, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, deb.Default.ConventionalFileName(info))
	info.Target = path
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if err := deb.Default.Package(info, f); err != nil {
		f.Close()
		os.Remove(path)
		return "", fmt.Errorf("package: %w", err)
	}
	return path, f.Close()
}
