// Package snapshot keeps booted labs, so that a later up with the same
// shape restores one in seconds instead of booting: every guest's memory
// and device state, the control plane's directory (etcd, certificates,
// keys, kubeconfigs) and the files the guests were booted with.
//
// A snapshot is a directory named by its key (everything that shapes the
// lab, hashed) in the store; it is written under a temporary name and
// renamed when complete, so a snapshot that exists is whole.
package snapshot

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Key is what shapes a booted lab: a snapshot is restored only into a lab
// asked for with the same key. Parts are named, so list can show them.
type Key map[string]string

// ID is the key's hash, the snapshot's directory name.
func (k Key) ID() string {
	names := make([]string, 0, len(k))
	for n := range k {
		names = append(names, n)
	}
	slices.Sort(names)
	h := sha256.New()
	for _, n := range names {
		fmt.Fprintf(h, "%s=%s\n", n, k[n])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Meta describes a stored snapshot.
type Meta struct {
	ID      string    `json:"id"`
	Key     Key       `json:"key"`
	Created time.Time `json:"created"`
	// Guests are the domains whose memory it holds, by name.
	Guests []string `json:"guests"`
	// Bytes is its size on disk.
	Bytes int64 `json:"bytes"`
}

// Store is a directory of snapshots.
type Store struct{ Dir string }

const metaFile = "snapshot.json"

// Path is where snapshot id lives.
func (s Store) Path(id string) string { return filepath.Join(s.Dir, id) }

// Find returns the snapshot of key, if the store has a whole one.
func (s Store) Find(key Key) (Meta, bool) {
	m, err := readMeta(s.Path(key.ID()))
	return m, err == nil
}

// List returns the store's snapshots, newest first.
func (s Store) List() ([]Meta, error) {
	entries, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Meta
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if m, err := readMeta(s.Path(e.Name())); err == nil {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b Meta) int { return b.Created.Compare(a.Created) })
	return out, nil
}

// Remove deletes snapshot id; an unknown id is an error that says so.
func (s Store) Remove(id string) error {
	if id == "" || strings.ContainsAny(id, "/.") {
		return fmt.Errorf("snapshot %q: not a snapshot id (labcloud snapshot list shows them)", id)
	}
	if _, err := os.Stat(s.Path(id)); err != nil {
		return fmt.Errorf("snapshot %s: %w (labcloud snapshot list shows them)", id, err)
	}
	return os.RemoveAll(s.Path(id))
}

// Writer fills a snapshot under a temporary name until Commit.
type Writer struct {
	store Store
	meta  Meta
	Dir   string // where the snapshot's files go
}

// Begin starts writing the snapshot of key.
func (s Store) Begin(key Key) (*Writer, error) {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(s.Dir, ".writing-")
	if err != nil {
		return nil, err
	}
	return &Writer{store: s, Dir: dir, meta: Meta{ID: key.ID(), Key: key}}, nil
}

// Commit records the guests, replaces any older snapshot of the key and
// returns what was stored.
func (w *Writer) Commit(guests []string) (Meta, error) {
	w.meta.Guests = guests
	w.meta.Created = time.Now().UTC()
	size, err := duBytes(w.Dir)
	if err != nil {
		return Meta{}, err
	}
	w.meta.Bytes = size
	data, err := json.MarshalIndent(w.meta, "", "  ")
	if err != nil {
		return Meta{}, err
	}
	if err := os.WriteFile(filepath.Join(w.Dir, metaFile), data, 0o600); err != nil {
		return Meta{}, err
	}
	final := w.store.Path(w.meta.ID)
	if err := os.RemoveAll(final); err != nil {
		return Meta{}, err
	}
	if err := os.Rename(w.Dir, final); err != nil {
		return Meta{}, err
	}
	return w.meta, w.store.prune()
}

// Keep is how many snapshots the store keeps: each is a few hundred MiB a
// guest, and one whose labcloud or tools changed is never restored again.
const Keep = 3

// prune removes all but the Keep newest snapshots, and what writers that
// never committed left.
func (s Store) prune() error {
	list, err := s.List()
	if err != nil {
		return err
	}
	for _, m := range list[min(Keep, len(list)):] {
		if err := os.RemoveAll(s.Path(m.ID)); err != nil {
			return err
		}
	}
	left, _ := filepath.Glob(filepath.Join(s.Dir, ".writing-*"))
	for _, d := range left {
		if fi, err := os.Stat(d); err == nil && time.Since(fi.ModTime()) > time.Hour {
			_ = os.RemoveAll(d)
		}
	}
	return nil
}

// Abort removes what was written.
func (w *Writer) Abort() { _ = os.RemoveAll(w.Dir) }

func readMeta(dir string) (Meta, error) {
	data, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		return Meta{}, err
	}
	var m Meta
	if err := json.Unmarshal(data, &m); err != nil {
		return Meta{}, fmt.Errorf("%s: %w", filepath.Join(dir, metaFile), err)
	}
	return m, nil
}

// duBytes is the disk space the files under dir take (sparse files
// count what they hold).
func duBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		} else {
			n += fi.Size()
		}
		return nil
	})
	return n, err
}
