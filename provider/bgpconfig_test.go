package provider

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A password file is read as ssh reads a private key: only when no group
// or other may read or write it and its owner is root or this process's
// user. Real files, real modes and owners (chown needs root).
func TestPasswordFileMode(t *testing.T) {
	const otherUID = 4242 // no one's: neither root nor this process's user
	for _, tc := range []struct {
		mode os.FileMode
		uid  int // -1: the file's creator
		want string
	}{
		{0o600, -1, ""},
		{0o400, -1, ""},
		{0o640, -1, "has mode 0640"},
		{0o604, -1, "has mode 0604"},
		{0o620, -1, "has mode 0620"},
		{0o602, -1, "has mode 0602"},
		{0o644, -1, "has mode 0644"},
		{0o600, 0, ""},
		{0o600, otherUID, fmt.Sprintf("is owned by uid %d", otherUID)},
	} {
		name := fmt.Sprintf("%04o", tc.mode)
		if tc.uid >= 0 {
			name += fmt.Sprintf(",uid-%d", tc.uid)
		}
		t.Run(name, func(t *testing.T) {
			if tc.uid >= 0 && os.Geteuid() != 0 {
				t.Skip("chown needs root")
			}
			pw := filepath.Join(t.TempDir(), "bgp-password")
			if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(pw, tc.mode); err != nil {
				t.Fatal(err)
			}
			if tc.uid >= 0 {
				if err := os.Chown(pw, tc.uid, -1); err != nil {
					t.Fatal(err)
				}
			}
			cfg := BGPConfig{ASN: 64513, RouterID: "10.0.0.1", Peers: []BGPPeerConfig{{Address: "10.0.0.254", ASN: 64512, PasswordFile: pw}}}
			opts, err := cfg.SpeakerOptions()
			if tc.want == "" {
				if err != nil || opts.Peers[0].Password != "s3cret" {
					t.Fatalf("password %q, err %v; want s3cret", opts.Peers[0].Password, err)
				}
				return
			}
			// The error names the field, the file and what is wrong with it.
			prefix := fmt.Sprintf("bgp.peers[0].passwordFile: %q %s", pw, tc.want)
			if err == nil || !strings.Contains(err.Error(), prefix) {
				t.Fatalf("err = %v, want %q", err, prefix)
			}
		})
	}

	// Not a password: a directory, a device that never ends, a file
	// larger than any TCP MD5 key.
	long := filepath.Join(t.TempDir(), "long")
	if err := os.WriteFile(long, []byte(strings.Repeat("x", maxPasswordFile+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		t.TempDir(): "is not a regular file",
		"/dev/zero": "is not a regular file",
		long:        fmt.Sprintf("is longer than %d bytes", maxPasswordFile),
	} {
		cfg := BGPConfig{ASN: 64513, RouterID: "10.0.0.1", Peers: []BGPPeerConfig{{Address: "10.0.0.254", ASN: 64512, PasswordFile: path}}}
		if _, err := cfg.SpeakerOptions(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", path, err, want)
		}
	}
}
