package lab

import (
	"fmt"

	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/lab/image"
)

// guest is one lab node's domain: what it boots and where its console goes.
type guest struct {
	index                int
	name                 string
	kernel, initrd, disk string
	console              string
}

// boot defines the guest's domain of type typ (accelKVM or accelTCG) and
// starts it.
func (g guest) boot(c *libvirt.Connect, typ string) error {
	d, err := c.DomainDefineXML(g.domainXML(typ))
	if err != nil {
		return fmt.Errorf("define %s: %w", g.name, err)
	}
	err = d.Create()
	d.Free()
	if err != nil {
		return fmt.Errorf("start %s: %w", g.name, err)
	}
	return nil
}

func (g guest) domainXML(typ string) string {
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
</domain>`, typ, g.name, guestMemoryMiB, guestVCPUs, cpuModel(typ), features(typ), g.kernel, g.initrd, image.Cmdline, g.disk, nodeMAC(g.index), NetworkName, g.console)
}

// Guest size: kubelet, containerd and kube-proxy with a few pods fit in 1 GiB
// with room to spare; the root disk is shared, so only what a guest writes
// costs memory.
const (
	guestMemoryMiB = 1024
	guestVCPUs     = 2
)

// cpuModel passes the host CPU through under KVM; under TCG it asks for
// every feature QEMU emulates (libvirt's default, qemu64, lacks the vector
// instructions Go's hashing and copying use, which makes image imports slow).
func cpuModel(domainType string) string {
	if domainType == accelKVM {
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

// features sets TCG's translation cache (libvirt >= 8.0); KVM has none.
func features(domainType string) string {
	if domainType == accelKVM {
		return ""
	}
	return fmt.Sprintf("<features><tcg><tb-cache unit='MiB'>%d</tb-cache></tcg></features>", tcgCacheMiB)
}
