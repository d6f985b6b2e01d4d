package sshtunnel

import "testing"

// What runs on the far side and what libvirt opens here, for each form
// of ssh URI libvirt documents.
func TestParseRemoteAndLocal(t *testing.T) {
	const files = "keyfile=/k&known_hosts=/kh"
	for _, tt := range []struct {
		uri, addr, user, ro, rw, local string
	}{
		{"qemu+ssh://ccm@kvm2/system?" + files, "kvm2:22", "ccm",
			"virt-ssh-helper -r qemu:///system", "virt-ssh-helper qemu:///system", "qemu+unix:///system?socket=%2Fs"},
		{"qemu+libssh://kvm2:2222?" + files, "kvm2:2222", "root",
			"virt-ssh-helper -r qemu:///system", "virt-ssh-helper qemu:///system", "qemu+unix:///system?socket=%2Fs"},
		{"qemu+ssh://[fd00::2]/system?proxy=netcat&" + files, "[fd00::2]:22", "root",
			"nc -U /var/run/libvirt/libvirt-sock-ro", "nc -U /var/run/libvirt/libvirt-sock", "qemu+unix:///system?socket=%2Fs"},
		{"qemu+ssh://kvm2/system?socket=/run/x's/sock&" + files, "kvm2:22", "root",
			`nc -U '/run/x'\''s/sock'`, `nc -U '/run/x'\''s/sock'`, "qemu+unix:///system?socket=%2Fs"},
	} {
		tg, err := Parse(tt.uri)
		if err != nil || tg == nil {
			t.Fatalf("%s: %v, %v", tt.uri, tg, err)
		}
		if tg.addr != tt.addr || tg.user != tt.user {
			t.Errorf("%s: %s@%s, want %s@%s", tt.uri, tg.user, tg.addr, tt.user, tt.addr)
		}
		if got := tg.command(true); got != tt.ro {
			t.Errorf("%s: read-only runs %q, want %q", tt.uri, got, tt.ro)
		}
		if got := tg.command(false); got != tt.rw {
			t.Errorf("%s: read-write runs %q, want %q", tt.uri, got, tt.rw)
		}
		if got := tg.localURI("/s"); got != tt.local {
			t.Errorf("%s: libvirt opens %q, want %q", tt.uri, got, tt.local)
		}
	}
	for _, uri := range []string{"qemu:///system", "qemu+unix:///system?socket=/s", "qemu+tls://kvm2/system", "test:///default"} {
		if tg, err := Parse(uri); tg != nil || err != nil {
			t.Errorf("%s: %v, %v; want no ssh target", uri, tg, err)
		}
	}
}
