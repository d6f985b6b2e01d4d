package image

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
)

// sums hashes files, remembering each file's hash beside its identity
// (device, inode, size, modification time), as git's index does: a file
// whose identity is unchanged is not read again. up checks the node
// disk's inputs (the tools, a few hundred MB) on every run; reading them
// took a second of each, restored labs included.
type sums struct {
	path  string // where they are kept; "" keeps them in memory only
	mu    sync.Mutex
	m     map[string]sumEntry
	dirty bool
}

type sumEntry struct {
	Dev, Ino, Size, MtimeNs int64
	Sum                     []byte
}

// loadSums reads the sums kept at path; a missing or unreadable file
// starts empty.
func loadSums(path string) *sums {
	s := &sums{path: path, m: map[string]sumEntry{}}
	if b, err := os.ReadFile(path); err == nil {
		_ = json.Unmarshal(b, &s.m)
	}
	return s
}

// sum is the SHA-256 of file's content.
func (s *sums) sum(file string) ([]byte, error) {
	fi, err := os.Stat(file)
	if err != nil {
		return nil, err
	}
	id := sumEntry{Size: fi.Size(), MtimeNs: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.Dev, id.Ino = int64(st.Dev), int64(st.Ino)
	}
	s.mu.Lock()
	e, ok := s.m[file]
	s.mu.Unlock()
	if ok && e.Dev == id.Dev && e.Ino == id.Ino && e.Size == id.Size && e.MtimeNs == id.MtimeNs {
		return e.Sum, nil
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	id.Sum = h.Sum(nil)
	s.mu.Lock()
	s.m[file], s.dirty = id, true
	s.mu.Unlock()
	return id.Sum, nil
}

// save writes the sums back, if any changed.
func (s *sums) save() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.dirty || s.path == "" {
		return nil
	}
	b, err := json.Marshal(s.m)
	if err != nil {
		return err
	}
	tmp := s.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	s.dirty = false
	return os.Rename(tmp, s.path)
}
