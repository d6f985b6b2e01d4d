package image

import (
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strings"

	"github.com/cavaliergopher/cpio"
)

// tree is the content of a newc cpio archive, keyed by path without a
// leading slash. Parent directories are added automatically.
type tree map[string]entry

type entry struct {
	mode cpio.FileMode // type and permission bits
	data []byte        // file content
	link string        // symlink target
}

func (t tree) dir(p string, perm cpio.FileMode) {
	p = clean(p)
	if p == "" {
		return
	}
	t.parents(p)
	t[p] = entry{mode: cpio.TypeDir | perm}
}

func (t tree) file(p string, perm cpio.FileMode, data []byte) {
	p = clean(p)
	t.parents(p)
	t[p] = entry{mode: cpio.TypeReg | perm, data: data}
}

func (t tree) symlink(p, target string) {
	p = clean(p)
	t.parents(p)
	t[p] = entry{mode: cpio.TypeSymlink | 0o777, link: target}
}

func (t tree) parents(p string) {
	for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
		if _, ok := t[d]; !ok {
			t[d] = entry{mode: cpio.TypeDir | 0o755}
		}
	}
}

func clean(p string) string {
	return strings.TrimPrefix(path.Clean("/"+p), "/")
}

// write emits the archive in path order (parents before children) with
// zero timestamps and owner root, so the same tree gives the same bytes.
func (t tree) write(w io.Writer) error {
	cw := cpio.NewWriter(w)
	for _, p := range sortedKeys(t) {
		e := t[p]
		h := &cpio.Header{Name: p, Mode: e.mode, Links: 1}
		var body []byte
		switch {
		case e.mode&cpio.ModeType == cpio.TypeReg:
			body = e.data
		case e.mode&cpio.ModeType == cpio.TypeSymlink:
			body = []byte(e.link)
		case e.mode&cpio.ModeType == cpio.TypeDir:
			h.Links = 2
		}
		h.Size = int64(len(body))
		if err := cw.WriteHeader(h); err != nil {
			return fmt.Errorf("cpio header %s: %w", p, err)
		}
		if _, err := cw.Write(body); err != nil {
			return fmt.Errorf("cpio data %s: %w", p, err)
		}
	}
	if err := cw.Close(); err != nil {
		return fmt.Errorf("cpio trailer: %w", err)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
