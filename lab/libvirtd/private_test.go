package libvirtd

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/lab/host"
)

// Two private libvirtds are two hypervisor hosts: each has a network of
// the same name and bridge, sees only its own network and domains, and
// leaves nothing behind when stopped.
func TestPrivateLibvirtdsAreApart(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it makes network and mount namespaces")
	}
	for _, bin := range []string{"libvirtd", "virtlogd", "tini", "unshare"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed (hack/install-deps.sh installs it)", bin)
		}
	}
	ctx := context.Background()
	var ps []Private
	for i := range 2 {
		ns := fmt.Sprintf("lctest-priv%d-%d", i, os.Getpid())
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add: %v: %s", err, out)
		}
		t.Cleanup(func() {
			// The network's dnsmasq outlives libvirtd.
			if pids, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil {
				for _, f := range strings.Fields(string(pids)) {
					if pid, err := strconv.Atoi(f); err == nil {
						host.Stop(pid)
					}
				}
			}
			_ = exec.Command("ip", "netns", "del", ns).Run()
		})
		p := Private{Root: filepath.Join("/run", fmt.Sprintf("lctest-priv%d-%d", i, os.Getpid())), Netns: ns}
		if _, err := p.Start(ctx, filepath.Join(t.TempDir(), "libvirtd.log")); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Stop)
		ps = append(ps, p)
	}
	net := Network{Name: "lctest", Bridge: "lctestbr0", IPv4Prefix: "10.199.0", Hosts4: []IPv4Host{{MAC: "52:54:00:00:00:01", IP: "10.199.0.100"}}}
	for i, p := range ps {
		c, err := libvirt.NewConnect(p.URI())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := net.Create(c); err != nil {
			t.Fatalf("libvirtd %d: %v", i, err)
		}
		if _, err := c.DomainDefineXML(fmt.Sprintf(`<domain type='qemu'><name>lctest-dom%d</name><memory unit='MiB'>64</memory>
<os><type arch='x86_64'>hvm</type></os></domain>`, i)); err != nil {
			t.Fatalf("libvirtd %d: define a domain: %v", i, err)
		}
	}
	for i, p := range ps {
		c, err := libvirt.NewConnectReadOnly(p.URI())
		if err != nil {
			t.Fatal(err)
		}
		names, err := c.ListDefinedDomains()
		c.Close()
		if err != nil || len(names) != 1 || names[0] != fmt.Sprintf("lctest-dom%d", i) {
			t.Errorf("libvirtd %d lists domains %v (%v), want only its own", i, names, err)
		}
		if out, err := exec.Command("ip", "-n", p.Netns, "link", "show", net.Bridge).CombinedOutput(); err != nil {
			t.Errorf("no bridge %s in %s: %v: %s", net.Bridge, p.Netns, err, out)
		}
	}
	if _, err := os.Stat(filepath.Join("/etc/libvirt/qemu", "lctest-dom0.xml")); err == nil {
		t.Errorf("a private libvirtd wrote its domain to the host's /etc/libvirt")
	}
	l, v := ps[0].Pids()
	ps[0].Stop()
	deadline := time.Now().Add(10 * time.Second)
	for (host.IsProcess(l, "libvirtd") || host.IsProcess(v, "virtlogd")) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if host.IsProcess(l, "libvirtd") || host.IsProcess(v, "virtlogd") {
		t.Errorf("Stop left libvirtd %d or virtlogd %d running", l, v)
	}
	if _, err := os.Stat(ps[0].Root); err == nil {
		t.Errorf("Stop left %s", ps[0].Root)
	}
}
