package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/internal/nstest"
	"github.com/labcloud/labcloud/lab/libvirtd"
)

// The second hypervisor host of a test: its own libvirtd behind an sshd
// (libvirtd.Private with SSH), in a network namespace of its own joined to
// the suite's by a veth pair, at sshHostAddr, with the suite's libvirt
// network's name and one domain defined (not running). Cleanups run last
// first: the network goes before libvirtd, libvirtd before the namespace.
const (
	sshHostAddr   = "10.87.0.2"
	sshHostPeer   = "10.87.0.1/30" // the suite's end of the pair
	sshHostZone   = "kvm2"
	sshHostDomain = "e2e-kvm2-dom"
)

func startSSHHost(t *testing.T) libvirtd.Private {
	t.Helper()
	ns := nstest.Named(t, "lce2e-kvm2")
	nstest.Link(t, os.Getenv(netnsEnv), "lce2e-kvm2", []string{sshHostPeer}, ns, "lan", []string{sshHostAddr + "/30"})
	p := libvirtd.Private{Root: fmt.Sprintf("/run/lce2e-kvm2-%d", os.Getpid()), Netns: ns, SSH: true}
	if _, err := p.Start(context.Background(), filepath.Join(t.TempDir(), "kvm2-libvirtd.log")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	c, err := libvirt.NewConnect(p.URI())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := (libvirtd.Network{Name: env.network, Bridge: "br-kvm2", IPv4Prefix: "10.86.0", DHCPFirst: 100, DHCPLast: 199}).Create(c); err != nil {
		t.Fatalf("kvm2's network: %v", err)
	}
	t.Cleanup(func() { // its dnsmasq would outlive libvirtd
		if n, err := c.LookupNetworkByName(env.network); err == nil {
			_ = n.Destroy()
			n.Free()
		}
	})
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
func withSSHHost(t *testing.T, cloudConfig, keyfile, knownHosts string) string {
	t.Helper()
	first := "    zone: e2e-zone\n"
	if !strings.Contains(cloudConfig, first) {
		t.Fatalf("not a cloud config of libvirtCloudConfig's:\n%s", cloudConfig)
	}
	return strings.Replace(cloudConfig, first, first+fmt.Sprintf("  - uri: %s\n    zone: %s\n    host: %s\n",
		libvirtd.SSHURI(sshHostAddr, keyfile, knownHosts), sshHostZone, sshHostZone), 1)
}
