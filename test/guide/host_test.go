package guide

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/lab/guest"
	"github.com/labcloud/labcloud/lab/host"
	"github.com/labcloud/labcloud/lab/libvirtd"
)

// kvmHost is a KVM host as Debian sets one up: a libvirtd of its own (in a
// network namespace and with directories of its own, so it never meets
// the machine's libvirtd or a lab's) with the network libvirt-daemon-system
// defines and autostarts, `default`, from the file Debian ships.
type kvmHost struct {
	t    *testing.T
	ns   string
	lv   libvirtd.Private
	conn *libvirt.Connect
	dir  string // guests' disks and consoles
}

// stockNetwork is the `default` network as libvirt-daemon-system installs it.
const stockNetwork = "/usr/share/libvirt/networks/default.xml"

func newKVMHost(t *testing.T) *kvmHost {
	t.Helper()
	sweepKilledRuns()
	h := &kvmHost{t: t, ns: fmt.Sprintf("lcguide-%d", os.Getpid()), dir: t.TempDir()}
	if out, err := exec.Command("ip", "netns", "add", h.ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", h.ns, err, out)
	}
	t.Cleanup(h.remove)
	if out, err := exec.Command("ip", "-n", h.ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}
	h.lv = libvirtd.Private{Root: filepath.Join("/run", h.ns), Netns: h.ns}
	if _, err := h.lv.Start(context.Background(), filepath.Join(h.dir, "libvirtd.log")); err != nil {
		t.Fatal(err)
	}
	var err error
	if h.conn, err = libvirt.NewConnect(h.lv.URI()); err != nil {
		t.Fatal(err)
	}
	xml, err := os.ReadFile(stockNetwork)
	if err != nil {
		t.Fatalf("Debian's default network: %v (apt-get install libvirt-daemon-system ships it)", err)
	}
	n, err := h.conn.NetworkDefineXML(string(xml))
	if err != nil {
		t.Fatalf("define the default network: %v", err)
	}
	defer n.Free()
	if err := n.SetAutostart(true); err != nil {
		t.Fatal(err)
	}
	if err := n.Create(); err != nil {
		t.Fatalf("start the default network: %v", err)
	}
	return h
}

// remove destroys the guests and the network, stops libvirtd and what it
// left running in the namespace (dnsmasq), and deletes the namespace.
func (h *kvmHost) remove() {
	if h.conn != nil {
		if doms, err := h.conn.ListAllDomains(0); err == nil {
			for _, d := range doms {
				_ = d.Destroy()
				_ = d.Undefine()
				d.Free()
			}
		}
		if n, err := h.conn.LookupNetworkByName("default"); err == nil {
			_ = n.Destroy()
			n.Free()
		}
		h.conn.Close()
	}
	h.lv.Stop()
	deleteNamespace(h.ns)
}

// deleteNamespace stops what runs in ns and deletes it.
func deleteNamespace(ns string) {
	if pids, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil {
		for _, f := range strings.Fields(string(pids)) {
			if pid, err := strconv.Atoi(f); err == nil {
				host.Stop(pid)
			}
		}
	}
	_ = exec.Command("ip", "netns", "del", ns).Run()
}

// The control plane's guest fits etcd, the API server, the controller
// manager and the scheduler beside the kubelet, on two vCPUs; a worker
// runs a kubelet and a few pods on one (under TCG each vCPU is a host
// thread, and this host may have two cores for all three guests).
const (
	controlPlaneMiB, workerMiB     = 2048, 1536
	controlPlaneVCPUs, workerVCPUs = 2, 1
)

// boot starts guest name from its own copy of img's disk, with mac on
// the default network, as virt-install would with a cloud image. The
// disk ignores flushes (cache unsafe): a throwaway guest loses nothing
// that matters, and etcd's fsyncs would otherwise wait on the host's disk.
func (h *kvmHost) boot(name, mac string, controlPlane bool, img guestImage) error {
	mem, vcpus := workerMiB, workerVCPUs
	if controlPlane {
		mem, vcpus = controlPlaneMiB, controlPlaneVCPUs
	}
	disk := filepath.Join(h.dir, name+".raw")
	if out, err := exec.Command("cp", "--sparse=always", img.Disk, disk).CombinedOutput(); err != nil {
		return fmt.Errorf("copy the disk: %v: %s", err, out)
	}
	typ, _ := guest.ChooseAccel(guest.GatherEvidence())
	cpu := "<cpu mode='maximum'/>"
	if typ == guest.KVM {
		cpu = "<cpu mode='host-passthrough'/>"
	}
	xml := fmt.Sprintf(`<domain type='%s'>
  <name>%s</name>
  <memory unit='MiB'>%d</memory>
  <vcpu>%d</vcpu>
  %s
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>%s</kernel>
    <initrd>%s</initrd>
    <cmdline>root=/dev/vda rw console=ttyS0 net.ifnames=0 systemd.hostname=%s</cmdline>
  </os>
  <features><acpi/></features>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='unsafe'/>
      <source file='%s'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <interface type='network'>
      <mac address='%s'/>
      <source network='default'/>
      <model type='virtio'/>
    </interface>
    <serial type='file'><source path='%s' append='on'/><target port='0'/></serial>
  </devices>
</domain>`, typ, name, mem, vcpus, cpu, img.Kernel, img.Initrd, name, disk, mac, h.console(name))
	d, err := h.conn.DomainDefineXML(xml)
	if err != nil {
		return fmt.Errorf("define %s: %w", name, err)
	}
	defer d.Free()
	if err := d.Create(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	return nil
}

func (h *kvmHost) console(name string) string { return filepath.Join(h.dir, name+".console") }

// lease waits for the default network's DHCP lease of mac.
func (h *kvmHost) lease(ctx context.Context, mac string) (string, error) {
	n, err := h.conn.LookupNetworkByName("default")
	if err != nil {
		return "", err
	}
	defer n.Free()
	for {
		leases, err := n.GetDHCPLeases()
		if err != nil {
			return "", err
		}
		for _, l := range leases {
			if strings.EqualFold(l.Mac, mac) && l.Type == libvirt.IP_ADDR_TYPE_IPV4 {
				return l.IPaddr, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no DHCP lease for %s: %w", mac, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// ssh runs script with bash on the guest at ip, as root, from the host.
func (h *kvmHost) ssh(ctx context.Context, img guestImage, ip, script string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", h.ns, "ssh", "-i", img.Key,
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
		"-o", "ConnectTimeout=5", "-o", "BatchMode=yes", "root@"+ip, "bash", "-euo", "pipefail", "-s")
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// waitSSH waits until the guest at ip runs sshd and takes the key.
func (h *kvmHost) waitSSH(ctx context.Context, img guestImage, ip string) error {
	var last error
	for {
		if _, err := h.ssh(ctx, img, ip, "true"); err == nil {
			return nil
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("ssh root@%s: %w", ip, ctx.Err()), last)
		case <-time.After(2 * time.Second):
		}
	}
}

// logConsoles logs the end of every guest's serial console.
func (h *kvmHost) logConsoles() {
	consoles, _ := filepath.Glob(filepath.Join(h.dir, "*.console"))
	for _, c := range consoles {
		b, _ := os.ReadFile(c)
		h.t.Logf("%s:\n%s", filepath.Base(c), tail(string(b), 30))
	}
}

// lanGet fetches u from a LAN client: a namespace of its own, plugged
// into the host's bridge with an address outside DHCP's range and the pool.
func (h *kvmHost) lanGet(ctx context.Context, u string) (string, error) {
	client := h.ns + "-lan"
	if _, err := os.Stat("/run/netns/" + client); err != nil {
		port := fmt.Sprintf("lcgl%d", os.Getpid()%100000)
		for _, args := range [][]string{
			{"netns", "add", client},
			{"link", "add", port, "type", "veth", "peer", "name", "lan0", "netns", client},
			{"link", "set", port, "netns", h.ns},
			{"-n", h.ns, "link", "set", port, "master", "virbr0", "up"},
			{"-n", client, "addr", "add", "192.168.122.198/24", "dev", "lan0"},
			{"-n", client, "link", "set", "lan0", "up"},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				return "", fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
			}
		}
		h.t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", client).Run() })
	}
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", client, "curl", "-sS", "-m", "5", "--retry", "5", "--retry-all-errors", u).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// sweepKilledRuns removes what a killed run left: the namespaces named
// after a process that has ended, what runs in them (QEMU, libvirtd,
// dnsmasq) and their libvirtd's directories.
func sweepKilledRuns() {
	names, _ := filepath.Glob("/run/netns/lcguide-*")
	for _, p := range names {
		ns := filepath.Base(p)
		pid, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(ns, "lcguide-"), "-lan"))
		if err != nil || syscall.Kill(pid, 0) == nil {
			continue
		}
		deleteNamespace(ns)
		_ = os.RemoveAll(filepath.Join("/run", ns))
	}
}
