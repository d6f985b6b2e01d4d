package libvirtcloud

import (
	"testing"
	"time"
)

func TestCarryOverRunningSince(t *testing.T) {
	earlier, now := time.Unix(1000, 0), time.Unix(2000, 0)
	for _, tt := range []struct {
		name      string
		prev      Domain
		had       bool
		state     State
		wantSince time.Time
	}{
		{"first seen running: unknown start", Domain{}, false, StateRunning, time.Time{}},
		{"still running keeps its start", Domain{State: StateRunning, RunningSince: earlier}, true, StateRunning, earlier},
		{"started since last look", Domain{State: StateShutOff}, true, StateRunning, now},
		{"new after the first listing", Domain{}, true, StateRunning, now},
		{"stopped forgets", Domain{State: StateRunning, RunningSince: earlier}, true, StateShutOff, time.Time{}},
	} {
		d := Domain{State: tt.state}
		d.carryOver(tt.prev, tt.had, now)
		if !d.RunningSince.Equal(tt.wantSince) {
			t.Errorf("%s: RunningSince = %v, want %v", tt.name, d.RunningSince, tt.wantSince)
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
