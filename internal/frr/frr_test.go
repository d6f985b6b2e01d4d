package frr

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReachableNamesTheClosedParent(t *testing.T) {
	closed := filepath.Join(t.TempDir(), "closed")
	dir := filepath.Join(closed, "router")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	const uid = 4242 // not the owner of anything here
	if err := reachable(dir, uid); err == nil || !strings.Contains(err.Error(), closed+" is mode 0700") {
		t.Errorf("reachable(%s) = %v, want an error naming %s and its mode", dir, err, closed)
	}
	if err := os.Chmod(closed, 0o711); err != nil {
		t.Fatal(err)
	}
	// t.TempDir's own parents are private too; an open path is /tmp's own.
	open := filepath.Join(os.TempDir(), "x")
	if err := reachable(open, uid); err != nil {
		t.Errorf("reachable(%s) = %v, want nil", open, err)
	}
}

func TestFilesSplitByDaemon(t *testing.T) {
	files := Config{ASN: 64512, Neighbors: []Neighbor{{ASN: 64513, BFD: true, Password: "pw"}}}.Files()
	if strings.Contains(files["bgpd"], "profile labcloud\n  receive-interval") || !strings.Contains(files["bfdd"], "receive-interval 300") {
		t.Errorf("the BFD profile belongs in bfdd's file only:\n%v", files)
	}
	for _, want := range []string{"bfd profile labcloud", "password pw", "address-family ipv6 unicast"} {
		if !strings.Contains(files["bgpd"], want) {
			t.Errorf("bgpd's file lacks %q:\n%s", want, files["bgpd"])
		}
	}
}

// Router advertisements are zebra's: per interface, managed (DHCPv6), and
// only on the interfaces asked for.
func TestAdvertiseOnIsZebras(t *testing.T) {
	if files := (Config{ASN: 64512}).Files(); strings.Contains(files["zebra"], "suppress-ra") {
		t.Errorf("advertisements with none asked for:\n%s", files["zebra"])
	}
	files := Config{ASN: 64512, AdvertiseOn: []string{"lan0"}}.Files()
	want := "interface lan0\n no ipv6 nd suppress-ra\n ipv6 nd ra-interval 3\n ipv6 nd managed-config-flag\nexit\n"
	if !strings.Contains(files["zebra"], want) || strings.Contains(files["bgpd"], "suppress-ra") {
		t.Errorf("zebra's file lacks %q, or bgpd's has it:\n%v", want, files)
	}
}
