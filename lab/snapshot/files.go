package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// SaveDir copies the directory src into the snapshot as name, leaving out
// logs. While it copies, the processes pids are stopped (SIGSTOP): etcd
// then writes nothing, and the copy holds every write it completed, in
// order, as after a crash that lost nothing, which etcd recovers from.
func (w *Writer) SaveDir(name, src string, pids ...int) error {
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return fmt.Errorf("stop %d to copy %s: %w", pid, src, err)
		}
		defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }()
	}
	return copyTree(src, filepath.Join(w.Dir, name))
}

// RestoreDir puts the snapshot's directory name at dst, replacing what
// was there.
func (s Store) RestoreDir(m Meta, name, dst string) error {
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	return copyTree(filepath.Join(s.Path(m.ID), name), dst)
}

// copyTree copies src to dst, modes, sparseness and all, logs left out.
func copyTree(src, dst string) error {
	_ = os.RemoveAll(dst)
	if out, err := exec.Command("cp", "-a", "--sparse=always", "--reflink=auto", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("copy %s: %w: %s", src, err, out)
	}
	logs, _ := filepath.Glob(filepath.Join(dst, "*.log"))
	for _, l := range logs {
		_ = os.Remove(l)
	}
	return nil
}

// SaveFiles copies files into the snapshot's directory name; a file that
// does not exist is left out.
func (w *Writer) SaveFiles(name string, files ...string) error {
	dir := filepath.Join(w.Dir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range files {
		if _, err := os.Stat(f); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := copyTree(f, filepath.Join(dir, filepath.Base(f))); err != nil {
			return err
		}
	}
	return nil
}

// RestoreFiles copies the files of the snapshot's directory name into dst.
func (s Store) RestoreFiles(m Meta, name, dst string) error {
	files, err := filepath.Glob(filepath.Join(s.Path(m.ID), name, "*"))
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := copyTree(f, filepath.Join(dst, filepath.Base(f))); err != nil {
			return err
		}
	}
	return nil
}

// SaveJSON writes v into the snapshot as name.
func (w *Writer) SaveJSON(name string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(w.Dir, name), data, 0o600)
}

// ReadJSON reads the snapshot's name into v.
func (s Store) ReadJSON(m Meta, name string, v any) error {
	data, err := os.ReadFile(filepath.Join(s.Path(m.ID), name))
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}
