package lab

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"libvirt.org/go/libvirtxml"
)

func TestDomainXMLPerAccelerator(t *testing.T) {
	g := guest{index: 2, name: "lab-node-2", kernel: "/k", initrd: "/i", disk: "/d", console: "/c"}
	for _, tc := range []struct{ typ, cpu string }{{accelKVM, "host-passthrough"}, {accelTCG, "maximum"}} {
		var d libvirtxml.Domain
		if err := d.Unmarshal(g.domainXML(tc.typ)); err != nil {
			t.Fatalf("%s: %v", tc.typ, err)
		}
		if d.Type != tc.typ || d.CPU == nil || d.CPU.Mode != tc.cpu || d.Name != g.name {
			t.Errorf("%s: type %q, cpu %+v, name %q", tc.typ, d.Type, d.CPU, d.Name)
		}
		if tcg := d.Features != nil && d.Features.TCG != nil; tcg != (tc.typ == accelTCG) {
			t.Errorf("%s: TCG features %v", tc.typ, tcg)
		}
		if len(d.Devices.Interfaces) != 1 || d.Devices.Interfaces[0].MAC.Address != nodeMAC(2) {
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
		{accelKVM, 0, guestVCPUs},
		{accelKVM, 1, guestVCPUs},
		{accelTCG, 0, 1}, // 2 cores, 3 guests
		{accelTCG, 1, 1}, // 2 cores, 2 guests
		{accelTCG, 2, guestVCPUs},
		{accelTCG, 8, guestVCPUs},
	} {
		g := guest{index: 1, name: "lab-node-1", hostCoresEach: tc.hostCoresEach}
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

// TestSilentConsoles: a guest that wrote to its console is not silent; one
// with an empty or missing console is, once the deadline passes; waiting
// ends early when every guest has written.
func TestSilentConsoles(t *testing.T) {
	dir := t.TempDir()
	path := func(n string) string { return filepath.Join(dir, n) }
	if err := os.WriteFile(path("spoke"), []byte("Linux version"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path("empty"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	guests := map[string]guest{"spoke": {console: path("spoke")}, "empty": {console: path("empty")}, "none": {console: path("none")}}
	if got := silentConsoles(guests, time.Now().Add(50*time.Millisecond), 10*time.Millisecond); !slices.Equal(got, []string{"empty", "none"}) {
		t.Errorf("silent = %v, want [empty none]", got)
	}
	go func() {
		time.Sleep(30 * time.Millisecond)
		_ = os.WriteFile(path("empty"), []byte("x"), 0o600)
		_ = os.WriteFile(path("none"), []byte("x"), 0o600)
	}()
	start := time.Now()
	if got := silentConsoles(guests, time.Now().Add(5*time.Second), 10*time.Millisecond); len(got) != 0 || time.Since(start) > 3*time.Second {
		t.Errorf("silent = %v after %s, want none, early", got, time.Since(start))
	}
}
