package image

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A file whose identity (inode, size, modification time) is unchanged is
// not read again, across a save and a load; one whose modification time
// moved is.
func TestSumsFollowIdentity(t *testing.T) {
	dir := t.TempDir()
	f, kept := filepath.Join(dir, "kubelet"), filepath.Join(dir, "sums")
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(f, at, at); err != nil {
			t.Fatal(err)
		}
	}
	write("version one")
	s := loadSums(kept)
	first, err := s.sum(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.save(); err != nil {
		t.Fatal(err)
	}
	// Same size, same time, same inode: taken as unchanged.
	write("version two")
	again, err := loadSums(kept).sum(f)
	if err != nil || !bytes.Equal(again, first) {
		t.Fatalf("sum of an unchanged identity: %x, %v; want the kept %x", again, err, first)
	}
	at = at.Add(time.Second)
	write("version two")
	moved, err := loadSums(kept).sum(f)
	if err != nil || bytes.Equal(moved, first) {
		t.Fatalf("sum after the file changed: %x, %v; want a new one", moved, err)
	}
}
