package lab

import (
	"fmt"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// Domain types of the guests: KVM, or QEMU's emulation (TCG).
const (
	accelKVM = "kvm"
	accelTCG = "qemu"
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

// kvmEvidence is what the accelerator is chosen from.
type kvmEvidence struct {
	override   string   // LABCLOUD_ACCEL
	openErr    error    // opening /dev/kvm
	apiErr     error    // KVM_GET_API_VERSION
	apiVersion int      // its answer
	createErr  error    // KVM_CREATE_VM
	modules    []string // KVM modules loaded; only those in kvmModulesThatHang matter
}

// chooseAccel picks the guests' domain type from the evidence, and says
// why when it is not KVM: KVM when /dev/kvm opens, answers the API version
// and creates a VM, unless the module behind it is one known to hang
// stock guests. LABCLOUD_ACCEL=kvm|tcg overrides.
func chooseAccel(e kvmEvidence) (domainType, reason string) {
	switch e.override {
	case "kvm":
		return accelKVM, ""
	case "tcg":
		return accelTCG, "LABCLOUD_ACCEL=tcg"
	}
	var hangs string
	if i := slices.IndexFunc(e.modules, func(m string) bool { return slices.Contains(kvmModulesThatHang, m) }); i >= 0 {
		hangs = fmt.Sprintf("the host's KVM module is %s, which hangs stock guest kernels", e.modules[i])
	}
	switch {
	case e.openErr != nil && hangs != "":
		return accelTCG, fmt.Sprintf("/dev/kvm: %v; %s", e.openErr, hangs)
	case e.openErr != nil:
		return accelTCG, fmt.Sprintf("/dev/kvm: %v", e.openErr)
	case hangs != "":
		return accelTCG, hangs
	case e.apiErr != nil:
		return accelTCG, fmt.Sprintf("/dev/kvm does not answer KVM_GET_API_VERSION: %v", e.apiErr)
	case e.apiVersion != kvmAPIVersion:
		return accelTCG, fmt.Sprintf("/dev/kvm answers KVM API version %d, not %d", e.apiVersion, kvmAPIVersion)
	case e.createErr != nil:
		return accelTCG, fmt.Sprintf("/dev/kvm cannot create a VM: %v", e.createErr)
	}
	return accelKVM, ""
}

// gatherKVMEvidence asks this host: the override, which modules known to
// hang guests are loaded (/sys/module), and /dev/kvm itself.
func gatherKVMEvidence() kvmEvidence {
	e := kvmEvidence{override: os.Getenv("LABCLOUD_ACCEL")}
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
