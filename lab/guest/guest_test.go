package guest

import (
	"testing"

	"libvirt.org/go/libvirtxml"
)

func TestDomainXMLPerAccelerator(t *testing.T) {
	g := Guest{Name: "lab-node-2", Kernel: "/k", Initrd: "/i", Disk: "/d", Console: "/c", MAC: "52:54:00:7c:00:02", Network: "labcloud"}
	for _, tc := range []struct{ typ, cpu string }{{KVM, "host-passthrough"}, {TCG, "maximum"}} {
		var d libvirtxml.Domain
		if err := d.Unmarshal(g.domainXML(tc.typ)); err != nil {
			t.Fatalf("%s: %v", tc.typ, err)
		}
		if d.Type != tc.typ || d.CPU == nil || d.CPU.Mode != tc.cpu || d.Name != g.Name {
			t.Errorf("%s: type %q, cpu %+v, name %q", tc.typ, d.Type, d.CPU, d.Name)
		}
		if tcg := d.Features != nil && d.Features.TCG != nil; tcg != (tc.typ == TCG) {
			t.Errorf("%s: TCG features %v", tc.typ, tcg)
		}
		if len(d.Devices.Interfaces) != 1 || d.Devices.Interfaces[0].MAC.Address != g.MAC || d.Devices.Interfaces[0].Source.Network.Network != g.Network {
			t.Errorf("%s: interfaces %+v", tc.typ, d.Devices.Interfaces)
		}
	}
}

// TestGuestVCPUs: KVM guests get guestVCPUs; TCG guests only when the
// host has that many cores for each.
func TestGuestVCPUs(t *testing.T) {
	for _, tc := range []struct {
		typ           string
		hostCoresEach int
		want          int
	}{
		{KVM, 0, guestVCPUs},
		{KVM, 1, guestVCPUs},
		{TCG, 0, 1}, // 2 cores, 3 guests
		{TCG, 1, 1}, // 2 cores, 2 guests
		{TCG, 2, guestVCPUs},
		{TCG, 8, guestVCPUs},
	} {
		g := Guest{Name: "lab-node-1", MAC: "52:54:00:7c:00:01", Network: "labcloud", HostCoresEach: tc.hostCoresEach}
		var d libvirtxml.Domain
		if err := d.Unmarshal(g.domainXML(tc.typ)); err != nil {
			t.Fatal(err)
		}
		if d.VCPU == nil || int(d.VCPU.Value) != tc.want {
			t.Errorf("%s with %d host cores per guest: vcpu %+v, want %d", tc.typ, tc.hostCoresEach, d.VCPU, tc.want)
		}
		// Without ACPI the guest kernel sees one vCPU, whatever it has.
		if acpi := d.Features != nil && d.Features.ACPI != nil; acpi != (tc.want > 1) {
			t.Errorf("%s with %d vCPUs: ACPI %v", tc.typ, tc.want, acpi)
		}
	}
}
