package snapshot

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A snapshot exists for its key only once committed, is found by its
// key, listed newest first, replaced by a later one of the same key, and
// removed by id; what a writer left unfinished is neither found nor
// listed.
func TestStoreLifecycle(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	a, b := Key{"nodes": "2", "disk": "d1"}, Key{"nodes": "3", "disk": "d1"}
	if a.ID() == b.ID() || a.ID() != (Key{"disk": "d1", "nodes": "2"}).ID() {
		t.Fatalf("ids: %s %s: want equal keys equal and others apart", a.ID(), b.ID())
	}
	write := func(k Key, body string) Meta {
		w, err := s.Begin(k)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.SaveJSON("x.json", body); err != nil {
			t.Fatal(err)
		}
		m, err := w.Commit([]string{"lab-node-1"})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	write(a, "first")
	write(b, "other")
	m := write(a, "second")
	got, ok := s.Find(a)
	if !ok || got.ID != a.ID() || got.Bytes <= 0 || len(got.Guests) != 1 {
		t.Fatalf("Find(a) = %+v, %v", got, ok)
	}
	var body string
	if err := s.ReadJSON(got, "x.json", &body); err != nil || body != "second" {
		t.Fatalf("a's file: %q, %v; want the later snapshot's", body, err)
	}
	// A writer that never committed.
	w, err := s.Begin(Key{"nodes": "9"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.SaveJSON("x.json", "unfinished"); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Find(Key{"nodes": "9"}); ok {
		t.Error("a snapshot found before its commit")
	}
	list, err := s.List()
	if err != nil || len(list) != 2 || list[0].ID != m.ID {
		t.Fatalf("List = %+v, %v; want a's (newest) then b's", list, err)
	}
	if err := s.Remove(a.ID()); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Find(a); ok {
		t.Error("a found after its removal")
	}
	for _, id := range []string{a.ID(), "", "../x", ".writing-1"} {
		if err := s.Remove(id); err == nil || !strings.Contains(err.Error(), "snapshot list") {
			t.Errorf("Remove(%q) = %v, want an error that points at snapshot list", id, err)
		}
	}
	if _, err := os.Stat(filepath.Join(s.Path(b.ID()), metaFile)); err != nil {
		t.Errorf("b's snapshot: %v", err)
	}
}

// The store keeps the Keep newest snapshots.
func TestStoreKeepsTheNewest(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	var ids []string
	for i := range Keep + 2 {
		w, err := s.Begin(Key{"nodes": strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		m, err := w.Commit(nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID)
		time.Sleep(2 * time.Millisecond) // creation times apart
	}
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range list {
		got = append(got, m.ID)
	}
	want := []string{ids[len(ids)-1], ids[len(ids)-2], ids[len(ids)-3]}
	if !slices.Equal(got, want) {
		t.Errorf("kept %v, want the %d newest %v", got, Keep, want)
	}
}
