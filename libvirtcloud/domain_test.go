package libvirtcloud

import (
	"strings"
	"testing"
	"time"
)

func TestCarryOverLastDown(t *testing.T) {
	earlier, now := time.Unix(1000, 0), time.Unix(2000, 0)
	for _, tt := range []struct {
		name  string
		prev  Domain
		had   bool
		state State
		want  time.Time
	}{
		{"first seen running", Domain{}, false, StateRunning, time.Time{}},
		{"first seen shut off", Domain{}, false, StateShutOff, now},
		{"goes down", Domain{State: StateRunning}, true, StateShutOff, now},
		{"crashes", Domain{State: StateRunning}, true, StateCrashed, now},
		{"stays down keeps the time it went down", Domain{State: StateShutOff, LastDown: earlier}, true, StateShutOff, earlier},
		{"comes back up remembers", Domain{State: StateShutOff, LastDown: earlier}, true, StateRunning, earlier},
		{"running all along", Domain{State: StateRunning}, true, StateRunning, time.Time{}},
		{"a pause is not down", Domain{State: StateRunning}, true, StatePaused, time.Time{}},
		{"shut off after a pause", Domain{State: StatePaused}, true, StateShutOff, now},
	} {
		d := Domain{State: tt.state}
		d.carryOver(tt.prev, tt.had, now)
		if !d.LastDown.Equal(tt.want) {
			t.Errorf("%s: LastDown = %v, want %v", tt.name, d.LastDown, tt.want)
		}
	}
}

func TestParseDomainXMLMemoryUnitsAndMetadata(t *testing.T) {
	d, err := parseDomainXML(`<domain type='kvm'><name>n</name><uuid>AAAAAAAA-0000-0000-0000-000000000001</uuid>
<memory unit='GiB'>2</memory><vcpu>3</vcpu>
<metadata><other xmlns='urn:x'><instance-type>nope</instance-type></other>
<l:instance xmlns:l='https://labcloud.io/xmlns/domain/1'><l:instance-type> big </l:instance-type></l:instance></metadata>
<devices><interface type='bridge'><mac address='52:54:00:AA:BB:CC'/><source bridge='br0'/></interface></devices></domain>`)
	if err != nil {
		t.Fatal(err)
	}
	if d.UUID != "aaaaaaaa-0000-0000-0000-000000000001" || d.MemoryKiB != 2<<20 || d.VCPUs != 3 || d.Type != "kvm" || d.InstanceType != "big" {
		t.Errorf("parsed %+v", d)
	}
	if len(d.Interfaces) != 1 || d.Interfaces[0].MAC != "52:54:00:aa:bb:cc" || d.Interfaces[0].Bridge != "br0" {
		t.Errorf("interfaces %+v", d.Interfaces)
	}
	if _, err := parseDomainXML("<domain"); err == nil {
		t.Error("malformed XML accepted")
	}
}

// FuzzParseDomainXML: no definition crashes the parser, and what it
// accepts comes out in the cache's canonical form.
func FuzzParseDomainXML(f *testing.F) {
	f.Add(`<domain type='kvm'><name>n</name><uuid>AAAAAAAA-0000-0000-0000-000000000001</uuid><memory unit='GiB'>2</memory>` +
		`<devices><interface type='network'><mac address='52:54:00:AA:BB:CC'/><source network='labnet'/></interface></devices></domain>`)
	f.Add(`<domain type='test'><name>bad</name><devices><interface type='network'><mac address='52:54:00:00:00:77'/>` +
		`<bandwidth><inbound average='9999999999999999999'/></bandwidth></interface></devices></domain>`)
	f.Add(`<domain><metadata><l:instance xmlns:l='https://labcloud.io/xmlns/domain/1'><l:instance-type>x</l:instance-type></l:instance></metadata></domain>`)
	f.Fuzz(func(t *testing.T, desc string) {
		d, err := parseDomainXML(desc)
		if err != nil {
			return
		}
		if d.UUID != strings.ToLower(d.UUID) {
			t.Errorf("UUID %q not lower case", d.UUID)
		}
		for _, i := range d.Interfaces {
			if i.MAC != strings.ToLower(i.MAC) {
				t.Errorf("MAC %q not lower case", i.MAC)
			}
		}
	})
}
