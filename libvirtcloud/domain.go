// Package libvirtcloud keeps a read-mostly view of libvirt hypervisors: one
// connection per hypervisor with keepalive and reconnect, a domain cache fed
// by GetAllDomainStats, lifecycle events and a periodic resync, and address
// discovery (DHCP leases, guest agent, ARP table). Lookups are served from
// the cache, so steady-state lookups cost no libvirt call.
package libvirtcloud

import (
	"encoding/xml"
	"fmt"
	"strings"
	"time"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"
)

// State is a domain's run state, reduced to what the cloud contract needs.
type State int

// Domain states. Paused and other transient states count as running: the
// domain exists and is expected to come back without intervention.
const (
	StateUnknown State = iota
	StateRunning
	StatePaused
	StateShutOff
	StateCrashed
)

func (s State) String() string {
	switch s {
	case StateRunning:
		return "running"
	case StatePaused:
		return "paused"
	case StateShutOff:
		return "shut-off"
	case StateCrashed:
		return "crashed"
	}
	return "unknown"
}

// Down reports whether the domain is not running its guest: shut off or crashed.
func (s State) Down() bool { return s == StateShutOff || s == StateCrashed }

func stateFromLibvirt(s libvirt.DomainState) State {
	switch s {
	case libvirt.DOMAIN_RUNNING, libvirt.DOMAIN_BLOCKED, libvirt.DOMAIN_SHUTDOWN:
		return StateRunning
	case libvirt.DOMAIN_PAUSED, libvirt.DOMAIN_PMSUSPENDED:
		return StatePaused
	case libvirt.DOMAIN_SHUTOFF:
		return StateShutOff
	case libvirt.DOMAIN_CRASHED:
		return StateCrashed
	}
	return StateUnknown
}

// Interface is one of a domain's network interfaces.
type Interface struct {
	MAC     string // lower case
	Network string // libvirt network name, if attached to one
	Bridge  string // host bridge, when known
	// Target is the host's device for the NIC (the tap, e.g. vnet3)
	// while the domain runs.
	Target string
	// TapGoneAt is when the host saw Target deleted or leave its bridge
	// (Hypervisor.TapGone), so that the NIC carries no traffic, whatever
	// libvirt says yet; zero if it did not.
	TapGoneAt time.Time
}

// Domain is a snapshot of what the cloud provider needs to know about a
// libvirt domain. It is a value: callers may keep and compare it.
type Domain struct {
	UUID       string // lower case
	Name       string
	Hypervisor string // the zone of the hypervisor holding it
	Type       string // libvirt domain type: kvm, qemu, test, ...
	State      State
	VCPUs      int
	MemoryKiB  uint64
	Interfaces []Interface
	// InstanceType is the override from the domain's metadata, if any.
	InstanceType string
	// LastDown is when this process last saw the domain go down (shut off
	// or crashed; or first saw it down); zero if it has been up all along.
	// A Node report older than this predates the guest's current boot. A
	// pause is not down: the guest resumes where it was.
	LastDown time.Time
	// DownEventAt is when the libvirt lifecycle event that took the domain
	// down (stopped, crashed) reached this process: zero unless the domain
	// is down and an event, not a listing, showed it going down.
	DownEventAt time.Time
}

// carryOver keeps what a fresh description cannot know from prev, the
// previous snapshot of the same domain (had: there was one).
func (d *Domain) carryOver(prev Domain, had bool, now time.Time) {
	d.LastDown = prev.LastDown
	if d.State.Down() && (!had || !prev.State.Down()) {
		d.LastDown = now
	}
	d.DownEventAt = time.Time{}
	if had && d.State.Down() && prev.State.Down() {
		d.DownEventAt = prev.DownEventAt
	}
}

// MetadataNamespace is the XML namespace of labcloud's domain metadata:
//
//	<metadata>
//	  <labcloud:instance xmlns:labcloud="https://labcloud.io/xmlns/domain/1">
//	    <labcloud:instance-type>gpu-large</labcloud:instance-type>
//	  </labcloud:instance>
//	</metadata>
const MetadataNamespace = "https://labcloud.io/xmlns/domain/1"

// parseDomainXML turns a domain's XML description into a Domain (state and
// hypervisor are filled by the caller).
func parseDomainXML(desc string) (Domain, error) {
	var x libvirtxml.Domain
	if err := x.Unmarshal(desc); err != nil {
		return Domain{}, fmt.Errorf("parse domain XML: %w", err)
	}
	d := Domain{
		UUID: strings.ToLower(x.UUID),
		Name: x.Name,
		Type: x.Type,
	}
	if x.VCPU != nil {
		d.VCPUs = int(x.VCPU.Value)
	}
	if x.Memory != nil {
		d.MemoryKiB = memoryKiB(uint64(x.Memory.Value), x.Memory.Unit)
	}
	if x.Devices != nil {
		for _, ifc := range x.Devices.Interfaces {
			if ifc.MAC == nil {
				continue
			}
			i := Interface{MAC: strings.ToLower(ifc.MAC.Address)}
			if ifc.Target != nil {
				i.Target = ifc.Target.Dev
			}
			if s := ifc.Source; s != nil {
				if s.Network != nil {
					i.Network, i.Bridge = s.Network.Network, s.Network.Bridge
				}
				if s.Bridge != nil {
					i.Bridge = s.Bridge.Bridge
				}
			}
			d.Interfaces = append(d.Interfaces, i)
		}
	}
	if x.Metadata != nil {
		d.InstanceType = metadataInstanceType(x.Metadata.XML)
	}
	return d, nil
}

// memoryKiB converts a libvirt memory value to KiB (libvirt's default unit).
func memoryKiB(v uint64, unit string) uint64 {
	switch strings.ToLower(unit) {
	case "b", "bytes":
		return v / 1024
	case "m", "mib":
		return v * 1024
	case "g", "gib":
		return v * 1024 * 1024
	case "t", "tib":
		return v * 1024 * 1024 * 1024
	case "kb":
		return v * 1000 / 1024
	case "mb":
		return v * 1000 * 1000 / 1024
	case "gb":
		return v * 1000 * 1000 * 1000 / 1024
	}
	return v // "", "k", "KiB"
}

// metadataInstanceType reads labcloud's instance-type override from the
// inner XML of <metadata>; foreign metadata is ignored.
func metadataInstanceType(inner string) string {
	var m struct {
		Instances []struct {
			XMLName      xml.Name
			InstanceType string `xml:"instance-type"`
		} `xml:",any"`
	}
	if err := xml.Unmarshal([]byte("<m>"+inner+"</m>"), &m); err != nil {
		return ""
	}
	for _, i := range m.Instances {
		if i.XMLName.Space == MetadataNamespace && i.XMLName.Local == "instance" {
			return strings.TrimSpace(i.InstanceType)
		}
	}
	return ""
}
