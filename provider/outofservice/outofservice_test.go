package outofservice

import (
	"errors"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/labcloud/labcloud/libvirtcloud"
)

// hypervisor answers for one domain, in a state, or fails as told.
type hypervisor struct {
	zone  string
	state libvirtcloud.State // StateUnknown with err nil: no such domain
	err   error
}

func (h hypervisor) Zone() string { return h.zone }
func (h hypervisor) DomainByUUID(uuid string) (libvirtcloud.Domain, error) {
	switch {
	case h.err != nil:
		return libvirtcloud.Domain{}, h.err
	case h.state == libvirtcloud.StateUnknown:
		return libvirtcloud.Domain{}, fmt.Errorf("uuid %s: %w", uuid, libvirtcloud.ErrNotFound)
	}
	return libvirtcloud.Domain{UUID: uuid, Name: "node-1", Hypervisor: h.zone, State: h.state}, nil
}
func (h hypervisor) Subscribe() (<-chan libvirtcloud.Event, func()) { return nil, func() {} }

// TestConfirm: only hypervisors that all answer, and that agree the domain
// exists and none runs it, confirm it is down.
func TestConfirm(t *testing.T) {
	var (
		running     = hypervisor{zone: "a", state: libvirtcloud.StateRunning}
		paused      = hypervisor{zone: "a", state: libvirtcloud.StatePaused}
		shutOff     = hypervisor{zone: "a", state: libvirtcloud.StateShutOff}
		crashed     = hypervisor{zone: "b", state: libvirtcloud.StateCrashed}
		none        = hypervisor{zone: "c"}
		unreachable = hypervisor{zone: "d", err: fmt.Errorf("qemu+ssh://d/system: %w", libvirtcloud.ErrUnavailable)}
	)
	for _, tt := range []struct {
		name     string
		hvs      []Hypervisor
		down     bool
		fails    bool
		hostZone string // where the domain that decides is
	}{
		{"shut off", []Hypervisor{shutOff}, true, false, "a"},
		{"crashed, not on the other", []Hypervisor{none, crashed}, true, false, "b"},
		{"running", []Hypervisor{running}, false, false, "a"},
		{"paused is not down", []Hypervisor{paused}, false, false, "a"},
		{"migrated: shut off here, running there", []Hypervisor{crashed, running}, false, false, "a"},
		{"nowhere: the Node's deletion is upstream's", []Hypervisor{none}, false, false, ""},
		{"a hypervisor that cannot answer confirms nothing", []Hypervisor{shutOff, unreachable}, false, true, ""},
		{"unreachable first", []Hypervisor{unreachable, shutOff}, false, true, ""},
	} {
		d, down, err := Confirm(tt.hvs, "0a1b2c3d-0000-4000-8000-000000000001")
		if down != tt.down || (err != nil) != tt.fails {
			t.Errorf("%s: down %v, err %v; want down %v, failing %v", tt.name, down, err, tt.down, tt.fails)
		}
		if tt.fails && !errors.Is(err, libvirtcloud.ErrUnavailable) {
			t.Errorf("%s: %v, want the hypervisor's ErrUnavailable", tt.name, err)
		}
		if tt.hostZone != "" && d.Hypervisor != tt.hostZone {
			t.Errorf("%s: answered with the domain on %q, want the one on %q", tt.name, d.Hypervisor, tt.hostZone)
		}
	}
}

// TestTaintIsOursAlone: the taint is added once, and only the one this
// package added is ever removed; an administrator's stays.
func TestTaintIsOursAlone(t *testing.T) {
	n := &v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "example.com/other", Effect: v1.TaintEffectNoSchedule}}}}
	if !addTaint(n) || addTaint(n) {
		t.Fatalf("addTaint twice: taints %v, want it added once", n.Spec.Taints)
	}
	if got := taintOf(n); got == nil || got.Value != TaintValue || got.Effect != v1.TaintEffectNoExecute || got.TimeAdded == nil {
		t.Fatalf("taint %+v, want %s=%s:NoExecute with its time", got, TaintKey, TaintValue)
	}
	if !removeTaint(n) || removeTaint(n) || len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != "example.com/other" {
		t.Fatalf("removeTaint: taints %v, want only the other taint left", n.Spec.Taints)
	}

	admins := &v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: TaintKey, Value: "nodeshutdown", Effect: v1.TaintEffectNoExecute}}}}
	if addTaint(admins) || removeTaint(admins) || len(admins.Spec.Taints) != 1 {
		t.Errorf("an administrator's out-of-service taint was changed: %v", admins.Spec.Taints)
	}
}
