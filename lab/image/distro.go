package image

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Distro is what differs per host distribution for the guest kernel. The
// packages themselves are listed in hack/install-deps.sh, which runs before
// Go is installed; TestInstallDepsPackages keeps the two in step.
type Distro struct {
	ID, VersionID string // os-release ID and VERSION_ID
	// KernelPackage is the package that installs the guest kernel and its
	// modules.
	KernelPackage string
	// KernelGlob is where KernelPackage puts its kernels.
	KernelGlob string
}

// distros are the distributions hack/install-deps.sh supports. Ubuntu's
// guest kernel is the generic one with its base modules (linux-image-virtual),
// not the kvm flavour: that is cut down further than the netfilter and bridge
// modules the nodes need.
var distros = []Distro{
	{"debian", "12", "linux-image-cloud-amd64", "/boot/vmlinuz-*-cloud-amd64"},
	{"debian", "13", "linux-image-cloud-amd64", "/boot/vmlinuz-*-cloud-amd64"},
	{"ubuntu", "24.04", "linux-image-virtual", "/boot/vmlinuz-*-generic"},
}

var errUnknownDistro = errors.New("unsupported distribution (supported: debian 12, debian 13, ubuntu 24.04)")

// DistroOf reads an os-release file and returns its distribution; an
// unknown one is an errUnknownDistro naming its ID and VERSION_ID.
func DistroOf(osRelease string) (Distro, error) {
	b, err := os.ReadFile(osRelease)
	if err != nil {
		return Distro{}, fmt.Errorf("host distribution: %w", err)
	}
	vars := parseOSRelease(b)
	for _, d := range distros {
		if d.ID == vars["ID"] && d.VersionID == vars["VERSION_ID"] {
			return d, nil
		}
	}
	return Distro{}, fmt.Errorf("%s: ID=%s VERSION_ID=%s: %w", osRelease, vars["ID"], vars["VERSION_ID"], errUnknownDistro)
}

// hostOSRelease is the host's os-release file: /etc/os-release, or
// /usr/lib/os-release where /etc has none (os-release(5)).
func hostOSRelease() string {
	if _, err := os.Stat("/etc/os-release"); err == nil {
		return "/etc/os-release"
	}
	return "/usr/lib/os-release"
}

// parseOSRelease reads os-release's KEY=value lines, values optionally
// quoted in shell style.
func parseOSRelease(b []byte) map[string]string {
	vars := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		if u, err := strconv.Unquote(v); err == nil {
			v = u
		} else if len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
			v = v[1 : len(v)-1]
		}
		vars[k] = v
	}
	return vars
}
