package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/lab/host"
	"github.com/labcloud/labcloud/lab/libvirtd"
)

// The second hypervisor host of a test: its own libvirtd behind an sshd
// (libvirtd.Private with SSH), in a network namespace of its own joined to
// the suite's by a veth pair, at sshHostAddr, with the suite's libvirt
// network's name and one domain defined (not running).
const (
	sshHostAddr   = "10.87.0.2"
	sshHostPeer   = "10.87.0.1/30" // the suite's end of the pair
	sshHostZone   = "kvm2"
	sshHostDomain = "e2e-kvm2-dom"
)

func startSSHHost(t *testing.T) libvirtd.Private {
	t.Helper()
	ns := fmt.Sprintf("lce2e-%d-kvm2", os.Getpid())
	t.Cleanup(func() {
		if pids, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil {
			for _, f := range strings.Fields(string(pids)) {
				if pid, err := strconv.Atoi(f); err == nil {
					host.Stop(pid) // the network's dnsmasq outlives libvirtd
				}
			}
		}
		_ = exec.Command("ip", "link", "del", "lce2e-kvm2").Run()
		_ = exec.Command("ip", "netns", "del", ns).Run()
	})
	for _, args := range [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		{"link", "add", "lce2e-kvm2", "type", "veth", "peer", "name", "lan", "netns", ns},
		{"addr", "add", sshHostPeer, "dev", "lce2e-kvm2"},
		{"link", "set", "lce2e-kvm2", "up"},
		{"-n", ns, "addr", "add", sshHostAddr + "/30", "dev", "lan"},
		{"-n", ns, "link", "set", "lan", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	p := libvirtd.Private{Root: fmt.Sprintf("/run/lce2e-kvm2-%d", os.Getpid()), Netns: ns, SSH: true}
	if _, err := p.Start(context.Background(), filepath.Join(t.TempDir(), "kvm2-libvirtd.log")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	c, err := libvirt.NewConnect(p.URI())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := (libvirtd.Network{Name: env.network, Bridge: "br-kvm2", IPv4Prefix: "10.86.0", DHCPFirst: 100, DHCPLast: 199}).Create(c); err != nil {
		t.Fatalf("kvm2's network: %v", err)
	}
	d, err := c.DomainDefineXML(fmt.Sprintf(`<domain type='qemu'><name>%s</name><memory unit='MiB'>64</memory>
<os><type arch='x86_64'>hvm</type></os></domain>`, sshHostDomain))
	if err != nil {
		t.Fatalf("kvm2's domain: %v", err)
	}
	d.Free()
	return p
}

// withSSHHost adds to a cloud config of libvirtCloudConfig's the second
// host, reached over ssh with the key and known_hosts at the paths given.
func withSSHHost(cloudConfig, keyfile, knownHosts string) string {
	first := "    zone: e2e-zone\n"
	if !strings.Contains(cloudConfig, first) {
		panic("withSSHHost: not a cloud config of libvirtCloudConfig's")
	}
	return strings.Replace(cloudConfig, first, first+fmt.Sprintf("  - uri: %s\n    zone: %s\n    host: %s\n",
		libvirtd.SSHURI(sshHostAddr, keyfile, knownHosts), sshHostZone, sshHostZone), 1)
}
