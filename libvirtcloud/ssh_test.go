package libvirtcloud

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/labcloud/labcloud/internal/nstest"
	"github.com/labcloud/labcloud/lab/libvirtd"
)

// A remote hypervisor over ssh as the CCM reaches one: a real sshd in
// front of a real libvirtd, another host in a network namespace the test
// makes, and the key and known_hosts in a directory standing for
// /etc/libvirt-cloud-controller-manager, made as docs/several-hosts.md
// says (ssh-keygen, ssh-keyscan). The CCM's connection over qemu+ssh://
// (its own ssh client, a socket for libvirt) caches the remote's domain;
// a missing key, a missing known_hosts, a host key that differs from the
// one known, a host not known, a key the host refuses and a far side that
// cannot run libvirt's helper each fail, naming the file, the host or what
// the far side said.
func TestSSHHypervisor(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it makes network and mount namespaces")
	}
	for _, bin := range []string{"libvirtd", "virtlogd", "tini", "unshare", "sshd", "ssh-keygen", "ssh-keyscan"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed (hack/install-deps.sh installs it)", bin)
		}
	}
	if err := StartEventLoop(); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ns := nstest.Named(t, "lctest-ssh")
	remote := libvirtd.Private{Root: fmt.Sprintf("/run/lctest-ssh-%d", os.Getpid()), Netns: ns, SSH: true}
	if _, err := remote.Start(ctx, filepath.Join(t.TempDir(), "libvirtd.log")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(remote.Stop)
	c, err := libvirt.NewConnect(remote.URI())
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.DomainDefineXML(`<domain type='qemu'><name>lctest-remote</name><memory unit='MiB'>64</memory>
<os><type arch='x86_64'>hvm</type></os></domain>`)
	c.Close()
	if err != nil {
		t.Fatal(err)
	}

	const addr = "127.0.0.1" // the remote host, in its namespace
	etc := t.TempDir()
	keyfile, known, err := remote.GrantSSH(etc, addr, ns)
	if err != nil {
		t.Fatal(err)
	}
	uri := libvirtd.SSHURI(addr, keyfile, known)
	if err := CheckTransport(uri); err != nil {
		t.Fatalf("CheckTransport(%s): %v", uri, err)
	}
	h := newHypervisor(ctx, Options{URI: uri, Zone: "kvm2"})
	start := time.Now()
	conn, ids, err := connectIn(t, ns, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("connected over ssh in %s", time.Since(start).Round(time.Millisecond))
	go func() {
		defer close(h.stopped)
		_ = h.serve(ctx, conn)
		h.disconnect(conn, ids)
	}()
	t.Cleanup(func() { <-h.stopped }) // after the context ends
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := h.WaitSynced(wctx); err != nil {
		t.Fatal(err)
	}
	if d, err := h.DomainByName("lctest-remote"); err != nil || d.Hypervisor != "kvm2" || d.State != StateShutOff {
		t.Fatalf("the remote's domain over ssh: %+v, %v", d, err)
	}

	// Failures, each with its own files.
	missing := filepath.Join(etc, "missing")
	other := filepath.Join(etc, "other")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", other).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	otherPub, err := os.ReadFile(other + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	otherKey := strings.Join(strings.Fields(string(otherPub))[:2], " ")
	// A key the host runs something else for, as a far side without
	// libvirt's helper would.
	broken := filepath.Join(etc, "broken")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", broken).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	brokenPub, err := os.ReadFile(broken + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(remote.Root, "authorized_keys"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(`restrict,command="echo no-helper-here >&2; exit 127" ` + string(brokenPub))
	if err := errors.Join(err, f.Close()); err != nil {
		t.Fatal(err)
	}
	changed, unknown := filepath.Join(etc, "known_hosts.changed"), filepath.Join(etc, "known_hosts.unknown")
	for f, line := range map[string]string{changed: addr + " " + otherKey, unknown: "192.0.2.1 " + otherKey} {
		if err := os.WriteFile(f, []byte(line+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name        string
		uri         string
		check, conn []string // what CheckTransport's error and the connection's name; check nil: no error
	}{
		{"missing key", libvirtd.SSHURI(addr, missing, known), []string{"keyfile " + missing}, []string{missing}},
		{"missing known_hosts", libvirtd.SSHURI(addr, keyfile, missing), []string{"known_hosts " + missing}, []string{missing, addr}},
		{"host key differs", libvirtd.SSHURI(addr, keyfile, changed), nil, []string{"differs", addr + ":22", changed}},
		{"host not known", libvirtd.SSHURI(addr, keyfile, unknown), nil, []string{unknown, addr, "ssh-keyscan " + addr}},
		{"key refused", libvirtd.SSHURI(addr, other, known), nil, []string{"root@" + addr + ":22", "unable to authenticate"}},
		{"far side fails", libvirtd.SSHURI(addr, broken, known), nil, []string{"root@" + addr + ":22", "no-helper-here"}},
	} {
		err := CheckTransport(tt.uri)
		for _, w := range tt.check {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: CheckTransport: %v, want it to name %q", tt.name, err, w)
			}
		}
		if tt.check == nil && err != nil {
			t.Errorf("%s: CheckTransport: %v", tt.name, err)
		}
		h := newHypervisor(ctx, Options{URI: tt.uri, Zone: "kvm2"})
		conn, ids, err := connectIn(t, ns, h)
		if err == nil {
			h.disconnect(conn, ids)
			t.Errorf("%s: connected", tt.name)
			continue
		}
		t.Logf("%s: %v", tt.name, err)
		for _, w := range tt.conn {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want it to name %q", tt.name, err, w)
			}
		}
	}
}

// connectIn makes h's connection from network namespace name: libvirt
// opens its socket on the calling thread.
func connectIn(t *testing.T, name string, h *Hypervisor) (conn *libvirt.Connect, ids []int, err error) {
	t.Helper()
	nstest.InNamed(t, name, func() { conn, ids, err = h.connect(t.Context()) })
	return conn, ids, err
}
