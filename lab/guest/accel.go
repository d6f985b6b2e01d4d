// Package guest is a lab guest's domain: the accelerator its QEMU uses
// (KVM where it works, else TCG, and why), its vCPUs and its libvirt XML.
package guest

import (
	"fmt"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// Domain types of the guests: KVM, or QEMU's emulation (TCG).
const (
	KVM = "kvm"
	TCG = "qemu"
)

// KVM's ioctls on /dev/kvm (linux/kvm.h) and the API version every
// kernel since 2.6.22 answers.
const (
	kvmGetAPIVersion = 0xAE00
	kvmCreateVM      = 0xAE01
	kvmAPIVersion    = 12
)

// kvmModulesThatHang are KVM modules known to hang stock guest kernels
// (right after "Booting from ROM").
var kvmModulesThatHang = []string{"kvm_pvm"}

// Evidence is what the accelerator is chosen from.
type Evidence struct {
	override   string   // LABCLOUD_ACCEL
	openErr    error    // opening /dev/kvm
	apiErr     error    // KVM_GET_API_VERSION
	apiVersion int      // its answer
	createErr  error    // KVM_CREATE_VM
	modules    []string // KVM modules loaded; only those in kvmModulesThatHang matter
}

// ChooseAccel picks the guests' domain type from the evidence, and says
// why when it is not KVM: KVM when /dev/kvm opens, answers the API version
// and creates a VM, unless the module behind it is one known to hang
// stock guests. LABCLOUD_ACCEL=kvm|tcg overrides.
func ChooseAccel(e Evidence) (domainType, reason string) {
	switch e.override {
	case "kvm":
		return KVM, ""
	case "tcg":
		return TCG, "LABCLOUD_ACCEL=tcg"
	}
	var hangs string
	if i := slices.IndexFunc(e.modules, func(m string) bool { return slices.Contains(kvmModulesThatHang, m) }); i >= 0 {
		hangs = fmt.Sprintf("the host's KVM module is %s, which hangs stock guest kernels", e.modules[i])
	}
	switch {
	case e.openErr != nil && hangs != "":
		return TCG, fmt.Sprintf("/dev/kvm: %v; %s", e.openErr, hangs)
	case e.openErr != nil:
		return TCG, fmt.Sprintf("/dev/kvm: %v", e.openErr)
	case hangs != "":
		return TCG, hangs
	case e.apiErr != nil:
		return TCG, fmt.Sprintf("/dev/kvm does not answer KVM_GET_API_VERSION: %v", e.apiErr)
	case e.apiVersion != kvmAPIVersion:
		return TCG, fmt.Sprintf("/dev/kvm answers KVM API version %d, not %d", e.apiVersion, kvmAPIVersion)
	case e.createErr != nil:
		return TCG, fmt.Sprintf("/dev/kvm cannot create a VM: %v", e.createErr)
	}
	return KVM, ""
}

// GatherEvidence asks this host: the override, which modules known to
// hang guests are loaded (/sys/module), and /dev/kvm itself.
func GatherEvidence() Evidence {
	e := Evidence{override: os.Getenv("LABCLOUD_ACCEL")}
	for _, m := range kvmModulesThatHang {
		if _, err := os.Stat("/sys/module/" + m); err == nil {
			e.modules = append(e.modules, m)
		}
	}
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		e.openErr = err
		return e
	}
	defer unix.Close(fd)
	if e.apiVersion, e.apiErr = unix.IoctlRetInt(fd, kvmGetAPIVersion); e.apiErr != nil {
		return e
	}
	vm, err := unix.IoctlRetInt(fd, kvmCreateVM)
	if err != nil {
		e.createErr = err
		return e
	}
	unix.Close(vm)
	return e
}
