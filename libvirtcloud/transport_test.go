package libvirtcloud

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Which files a URI's transport needs, and what is wrong with them.
func TestCheckTransport(t *testing.T) {
	dir := t.TempDir()
	key, known, empty := filepath.Join(dir, "id_ed25519"), filepath.Join(dir, "known_hosts"), filepath.Join(dir, "empty")
	for f, body := range map[string]string{key: "key\n", known: "kvm2 ssh-ed25519 AAAA\n", empty: ""} {
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	missing, fifo := filepath.Join(dir, "missing"), filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil { // opening it to read would wait for a writer
		t.Fatal(err)
	}
	both := "?keyfile=" + key + "&known_hosts=" + known
	for _, tt := range []struct {
		uri  string
		want []string // substrings of the error; none: no error
	}{
		{"qemu:///system", nil},
		{"qemu+unix:///system?socket=/run/x/libvirt-sock", nil},
		{"qemu+tls://kvm2/system", nil},
		{"qemu+libssh://ccm@kvm2/system" + both, nil},
		{"qemu+libssh2://ccm@kvm2:2222/system" + both, nil},
		{"qemu+libssh://ccm@kvm2/system?keyfile=" + key + "&known_hosts_verify=ignore", nil},
		{"qemu+libssh://ccm@kvm2/system?keyfile=" + missing + "&known_hosts=" + known, []string{"keyfile " + missing, "no such file"}},
		{"qemu+libssh://ccm@kvm2/system?keyfile=" + key + "&known_hosts=" + missing, []string{"known_hosts " + missing, "no such file"}},
		{"qemu+libssh://ccm@kvm2/system?keyfile=" + key + "&known_hosts=" + dir, []string{"known_hosts " + dir, "not a regular file"}},
		{"qemu+libssh://ccm@kvm2/system?keyfile=" + fifo + "&known_hosts=" + known, []string{"keyfile " + fifo, "not a regular file"}},
		{"qemu+libssh://ccm@kvm2/system?keyfile=" + key + "&known_hosts=" + empty, []string{"known_hosts " + empty, "is empty", "ssh-keyscan"}},
		{"qemu+libssh://ccm@kvm2/system?keyfile=id_ed25519&known_hosts=" + known, []string{"keyfile id_ed25519", "absolute"}},
		{"qemu+libssh://ccm@kvm2/system?known_hosts=" + known, []string{"no keyfile=", "/etc/libvirt-cloud-controller-manager/id_ed25519"}},
		{"qemu+libssh://ccm@kvm2/system?keyfile=" + key, []string{"no known_hosts=", "/etc/libvirt-cloud-controller-manager/known_hosts"}},
		{"qemu+libssh://ccm@kvm2/system", []string{"no keyfile=", "no known_hosts="}},
		{"qemu+ssh://ccm@kvm2/system" + both, nil},
		{"qemu+ssh://ccm@kvm2/system" + both + "&no_tty=1&sshauth=privkey", nil},
		{"qemu+ssh://ccm@kvm2/system?keyfile=" + key + "&no_verify=1", nil},
		{"qemu+ssh://ccm@kvm2/system" + both + "&sshauth=agent", []string{"sshauth=agent", "keyfile="}},
		{"qemu+ssh://ccm@kvm2/system" + both + "&known_hosts_verify=auto", []string{"known_hosts_verify=auto", "never adds keys"}},
		{"qemu+ssh://ccm@kvm2/system" + both + "&command=/bin/sh", []string{"parameter command="}},
		{"qemu+ssh://ccm@kvm2/system" + both + "&proxy=magic", []string{"proxy=magic"}},
		{"qemu+ssh:///system" + both, []string{"no host"}},
	} {
		err := CheckTransport(tt.uri)
		if len(tt.want) == 0 {
			if err != nil {
				t.Errorf("%s: %v", tt.uri, err)
			}
			continue
		}
		for _, w := range tt.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: err = %v, want it to say %q", tt.uri, err, w)
			}
		}
	}
}
