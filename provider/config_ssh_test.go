package provider

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A remote hypervisor over ssh names its key and known_hosts in its URI;
// the CCM does not start while either cannot be read, and says which
// hypervisor and which file. The config still loads, for withdraw: a
// package removed after its key was deleted still withdraws its routes.
func TestLoadConfigChecksSSHFiles(t *testing.T) {
	dir := t.TempDir()
	key, known := filepath.Join(dir, "id_ed25519"), filepath.Join(dir, "known_hosts")
	for _, f := range []string{key, known} {
		if err := os.WriteFile(f, []byte("x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	load := func(uri string) error {
		cfg, err := LoadConfig(strings.NewReader("host: kvm1\nhypervisors: [{uri: 'qemu:///system'}, {uri: '" + uri + "'}]"))
		if err != nil {
			t.Errorf("%s: the config does not load (withdraw could not run): %v", uri, err)
			return err
		}
		return errors.Join(err, cfg.CheckHypervisorFiles())
	}
	ok := "qemu+ssh://ccm@kvm2/system?keyfile=" + key + "&known_hosts=" + known
	if err := load(ok); err != nil {
		t.Fatalf("%s: %v", ok, err)
	}
	missing := filepath.Join(dir, "missing")
	for uri, want := range map[string][]string{
		"qemu+ssh://ccm@kvm2/system?keyfile=" + missing + "&known_hosts=" + known: {"hypervisors[1].uri", "keyfile " + missing},
		"qemu+ssh://ccm@kvm2/system?keyfile=" + key + "&known_hosts=" + missing:   {"hypervisors[1].uri", "known_hosts " + missing},
		"qemu+ssh://ccm@kvm2/system?keyfile=" + key:                               {"hypervisors[1].uri", "known_hosts="},
		"qemu+ssh://ccm@kvm2/system?keyfile=" + key:                               {"hypervisors[1].uri", "qemu+ssh://"},
	} {
		err := load(uri)
		for _, w := range want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: err = %v, want it to name %q", uri, err, w)
			}
		}
	}
}
