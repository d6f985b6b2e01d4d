package lab

import (
	"strings"
	"syscall"
	"testing"
)

func TestChooseAccel(t *testing.T) {
	working := kvmEvidence{apiVersion: kvmAPIVersion, modules: []string{"kvm", "kvm_amd"}}
	with := func(f func(*kvmEvidence)) kvmEvidence { e := working; f(&e); return e }
	for _, tc := range []struct {
		name   string
		e      kvmEvidence
		want   string
		reason string // a part of the reason; "" for KVM
	}{
		{"a VM runner's working /dev/kvm, hypervisor CPU flag or not", working, accelKVM, ""},
		{"no /dev/kvm", with(func(e *kvmEvidence) { e.openErr = syscall.ENOENT; e.modules = nil }), accelTCG, "/dev/kvm: no such file"},
		{"not allowed to open it", with(func(e *kvmEvidence) { e.openErr = syscall.EACCES }), accelTCG, "permission denied"},
		{"kvm_pvm behind /dev/kvm", with(func(e *kvmEvidence) { e.modules = []string{"kvm", "kvm_pvm"} }), accelTCG, "kvm_pvm, which hangs stock guest kernels"},
		{"kvm_pvm loaded, no /dev/kvm here", with(func(e *kvmEvidence) { e.openErr = syscall.ENOENT; e.modules = []string{"kvm_pvm"} }), accelTCG, "no such file or directory; the host's KVM module is kvm_pvm"},
		{"no answer to the API version", with(func(e *kvmEvidence) { e.apiErr = syscall.ENOTTY }), accelTCG, "KVM_GET_API_VERSION"},
		{"an unknown API version", with(func(e *kvmEvidence) { e.apiVersion = 11 }), accelTCG, "version 11, not 12"},
		{"no VM can be created", with(func(e *kvmEvidence) { e.createErr = syscall.ENOMEM }), accelTCG, "cannot create a VM"},
		{"LABCLOUD_ACCEL=tcg on a working KVM", with(func(e *kvmEvidence) { e.override = "tcg" }), accelTCG, "LABCLOUD_ACCEL=tcg"},
		{"LABCLOUD_ACCEL=kvm on kvm_pvm", with(func(e *kvmEvidence) { e.override = "kvm"; e.modules = []string{"kvm_pvm"} }), accelKVM, ""},
	} {
		got, reason := chooseAccel(tc.e)
		if got != tc.want || (tc.reason == "") != (reason == "") || !strings.Contains(reason, tc.reason) {
			t.Errorf("%s: %s %q, want %s with %q", tc.name, got, reason, tc.want, tc.reason)
		}
	}
}

// TestGatherKVMEvidence asks this host: whatever it has, the evidence is
// consistent (a device that did not open answered nothing), and the choice
// has a reason exactly when it is TCG.
func TestGatherKVMEvidence(t *testing.T) {
	t.Setenv("LABCLOUD_ACCEL", "")
	e := gatherKVMEvidence()
	if e.openErr != nil && (e.apiVersion != 0 || e.apiErr != nil || e.createErr != nil) {
		t.Errorf("evidence past a failed open: %+v", e)
	}
	typ, reason := chooseAccel(e)
	if (typ == accelTCG) != (reason != "") {
		t.Errorf("%s with reason %q", typ, reason)
	}
	t.Logf("this host: guests use %s %s (modules %v)", typ, reason, e.modules)
}
