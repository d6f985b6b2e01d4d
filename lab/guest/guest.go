package guest

import (
	"fmt"

	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/lab/image"
)

// Guest is one lab node's domain: what it boots, its NIC and where its
// console goes.
type Guest struct {
	Name                 string
	Kernel, Initrd, Disk string
	Console              string
	MAC, Network         string // its NIC: the MAC, on the libvirt network
	// HostCoresEach is the host's CPU count over the lab's guest count.
	HostCoresEach int
}

// Boot defines the guest's domain of type typ (KVM or TCG) and starts it.
func (g Guest) Boot(c *libvirt.Connect, typ string) error {
	d, err := c.DomainDefineXML(g.domainXML(typ))
	if err != nil {
		return fmt.Errorf("define %s: %w", g.Name, err)
	}
	err = d.Create()
	d.Free()
	if err != nil {
		return fmt.Errorf("start %s: %w", g.Name, err)
	}
	return nil
}

func (g Guest) domainXML(typ string) string {
	vcpus := g.vcpus(typ)
	return fmt.Sprintf(`<domain type='%s'>
  <name>%s</name>
  <memory unit='MiB'>%d</memory>
  <vcpu>%d</vcpu>
  %s
  %s
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>%s</kernel>
    <initrd>%s</initrd>
    <cmdline>%s</cmdline>
  </os>
  <on_poweroff>destroy</on_poweroff>
  <on_crash>destroy</on_crash>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='writeback'/>
      <source file='%s'/>
      <target dev='vda' bus='virtio'/>
      <readonly/>
      <shareable/>
    </disk>
    <interface type='network'>
      <mac address='%s'/>
      <source network='%s'/>
      <model type='virtio'/>
    </interface>
    <serial type='file'><source path='%s' append='on'/><target port='0'/></serial>
    <memballoon model='none'/>
  </devices>
</domain>`, typ, g.Name, guestMemoryMiB, vcpus, cpuModel(typ), features(typ, vcpus), g.Kernel, g.Initrd, image.Cmdline, g.Disk, g.MAC, g.Network, g.Console)
}

// Guest size: kubelet, containerd and kube-proxy with a few pods fit in 1 GiB
// with room to spare; the root disk is shared, so only what a guest writes
// costs memory.
const (
	guestMemoryMiB = 1024
	guestVCPUs     = 2
)

// vcpus is the guest's vCPU count under typ: guestVCPUs, but under TCG
// only when the host has that many cores for each guest. An emulated vCPU
// is a host thread that is busy whenever the guest runs on it, and TCG
// pays dearly for vCPUs that outnumber the host's cores (docs/performance.md).
func (g Guest) vcpus(typ string) int {
	if typ == KVM || g.HostCoresEach >= guestVCPUs {
		return guestVCPUs
	}
	return 1
}

// cpuModel passes the host CPU through under KVM; under TCG it asks for
// every feature QEMU emulates (libvirt's default, qemu64, lacks the vector
// instructions Go's hashing and copying use, which makes image imports slow).
func cpuModel(domainType string) string {
	if domainType == KVM {
		return "<cpu mode='host-passthrough'/>"
	}
	return "<cpu mode='maximum'/>"
}

// tcgCacheMiB bounds the code TCG keeps translated. QEMU's default is
// 1 GiB, which a guest fills (and so holds resident) within minutes of
// running pods: each guest grew to ~1.8 GiB RSS, and a killed QEMU took
// 1.2-2 s to release it before libvirt saw it die, which delayed every
// failover the lab measures. A guest's hot code fits in far less.
const tcgCacheMiB = 256

// features turns ACPI on for a guest of more than one vCPU (Debian's cloud
// kernel finds other CPUs only in ACPI's tables; a one-vCPU guest boots
// faster without it), and sets TCG's translation cache (libvirt >= 8.0).
func features(domainType string, vcpus int) string {
	var f string
	if vcpus > 1 {
		f = "<acpi/>"
	}
	if domainType != KVM {
		f += fmt.Sprintf("<tcg><tb-cache unit='MiB'>%d</tb-cache></tcg>", tcgCacheMiB)
	}
	if f == "" {
		return ""
	}
	return "<features>" + f + "</features>"
}
