package guest

import (
	"strings"
	"syscall"
	"testing"
)

func TestChooseAccel(t *testing.T) {
	working := Evidence{apiVersion: kvmAPIVersion, modules: []string{"kvm", "kvm_amd"}}
	with := func(f func(*Evidence)) Evidence { e := working; f(&e); return e }
	for _, tc := range []struct {
		name   string
		e      Evidence
		want   string
		reason string // a part of the reason; "" for KVM
	}{
		{"a VM runner's working /dev/kvm, hypervisor CPU flag or not", working, KVM, ""},
		{"no /dev/kvm", with(func(e *Evidence) { e.openErr = syscall.ENOENT; e.modules = nil }), TCG, "/dev/kvm: no such file"},
		{"not allowed to open it", with(func(e *Evidence) { e.openErr = syscall.EACCES }), TCG, "permission denied"},
		{"kvm_pvm behind /dev/kvm", with(func(e *Evidence) { e.modules = []string{"kvm", "kvm_pvm"} }), TCG, "kvm_pvm, which hangs stock guest kernels"},
		{"kvm_pvm loaded, no /dev/kvm here", with(func(e *Evidence) { e.openErr = syscall.ENOENT; e.modules = []string{"kvm_pvm"} }), TCG, "no such file or directory; the host's KVM module is kvm_pvm"},
		{"no answer to the API version", with(func(e *Evidence) { e.apiErr = syscall.ENOTTY }), TCG, "KVM_GET_API_VERSION"},
		{"an unknown API version", with(func(e *Evidence) { e.apiVersion = 11 }), TCG, "version 11, not 12"},
		{"no VM can be created", with(func(e *Evidence) { e.createErr = syscall.ENOMEM }), TCG, "cannot create a VM"},
		{"LABCLOUD_ACCEL=tcg on a working KVM", with(func(e *Evidence) { e.override = "tcg" }), TCG, "LABCLOUD_ACCEL=tcg"},
		{"LABCLOUD_ACCEL=kvm on kvm_pvm", with(func(e *Evidence) { e.override = "kvm"; e.modules = []string{"kvm_pvm"} }), KVM, ""},
	} {
		got, reason := ChooseAccel(tc.e)
		if got != tc.want || (tc.reason == "") != (reason == "") || !strings.Contains(reason, tc.reason) {
			t.Errorf("%s: %s %q, want %s with %q", tc.name, got, reason, tc.want, tc.reason)
		}
	}
}

// TestGatherEvidence asks this host: whatever it has, the evidence is
// consistent (a device that did not open answered nothing), and the choice
// has a reason exactly when it is TCG.
func TestGatherEvidence(t *testing.T) {
	t.Setenv("LABCLOUD_ACCEL", "")
	e := GatherEvidence()
	if e.openErr != nil && (e.apiVersion != 0 || e.apiErr != nil || e.createErr != nil) {
		t.Errorf("evidence past a failed open: %+v", e)
	}
	typ, reason := ChooseAccel(e)
	if (typ == TCG) != (reason != "") {
		t.Errorf("%s with reason %q", typ, reason)
	}
	t.Logf("this host: guests use %s %s (modules %v)", typ, reason, e.modules)
}
