package nodeagent

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadHost(t *testing.T) {
	root := t.TempDir()
	write := func(p, s string) {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if h := ReadHost(root); h.SystemUUID != "" || h.CPUs == 0 {
		t.Errorf("ReadHost(empty root) = %+v", h)
	}
	write("sys/class/dmi/id/product_uuid", "5A0E2D7C-4B1F-4E8A-9C3D-2F6B7A8C9D0E\n")
	write("proc/sys/kernel/random/boot_id", "b00t\n")
	write("proc/sys/kernel/osrelease", "6.1.0-56-cloud-amd64\n")
	write("proc/meminfo", "MemTotal:         161928 kB\n")
	h := ReadHost(root)
	if h.SystemUUID != "5a0e2d7c-4b1f-4e8a-9c3d-2f6b7a8c9d0e" || h.BootID != "b00t" ||
		h.KernelVersion != "6.1.0-56-cloud-amd64" || h.MemoryBytes != 161928<<10 {
		t.Errorf("ReadHost = %+v", h)
	}
}
