package image

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path"

	"github.com/cavaliergopher/cpio"
)

// NodeFile is one file of a node's own: its hostname, credentials,
// kubeconfigs and daemon configurations.
type NodeFile struct {
	Path string // absolute, in the guest
	Mode fs.FileMode
	Data []byte
}

// nodeConfigDir is where the node archive puts its files; the boot /init
// copies them onto the root.
const nodeConfigDir = "node-config"

// NodeArchive returns the gzip'd newc cpio archive with one node's files
// (under node-config/). Appended to the base initramfs, it completes the
// image of that node.
func NodeArchive(files []NodeFile) ([]byte, error) {
	t := tree{}
	t.dir(nodeConfigDir, 0o755)
	for _, f := range files {
		if !path.IsAbs(f.Path) {
			return nil, fmt.Errorf("node file %q: want an absolute path", f.Path)
		}
		t.file(path.Join(nodeConfigDir, f.Path), cpio.FileMode(f.Mode.Perm()), f.Data)
	}
	var buf bytes.Buffer
	if err := writeGzip(&buf, t.write); err != nil {
		return nil, fmt.Errorf("node archive: %w", err)
	}
	return buf.Bytes(), nil
}

// WriteNodeInitrd writes the complete initrd of one node to path (mode
// 0600, it holds credentials): the base initramfs, zero padding to a 4-byte
// boundary, and the node's archive. The kernel unpacks both in order.
func WriteNodeInitrd(path, base string, files []NodeFile) error {
	node, err := NodeArchive(files)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(base)
	if err != nil {
		return fmt.Errorf("read base initramfs: %w", err)
	}
	out := make([]byte, 0, len(b)+3+len(node))
	out = append(out, b...)
	for len(out)%4 != 0 {
		out = append(out, 0)
	}
	out = append(out, node...)
	return writeFileAtomic(path, out, 0o600)
}
