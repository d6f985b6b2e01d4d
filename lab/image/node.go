package image

import (
	"bytes"
	"fmt"
	"os"

	"github.com/labcloud/labcloud/lab/nodeagent/nodeconfig"
)

// NodeConfig is what a node's archive carries: its name, the API server
// URL, CA and bearer token. It lands in the guest at nodeconfig.DefaultPath.
type NodeConfig = nodeconfig.Config

// NodeArchive returns the gzip'd newc cpio archive with one node's
// configuration: /etc/lab-node/config.json (mode 0600, it holds the token)
// and /etc/hostname. Appended to the base initramfs, it completes the image
// of that node.
func NodeArchive(cfg NodeConfig) ([]byte, error) {
	js, err := cfg.Marshal()
	if err != nil {
		return nil, err
	}
	t := tree{}
	t.dir("etc", 0o755)
	t.dir("etc/lab-node", 0o700)
	t.file(nodeconfig.DefaultPath, 0o600, js)
	t.file("etc/hostname", 0o644, []byte(cfg.NodeName+"\n"))
	var buf bytes.Buffer
	if err := writeGzip(&buf, t.write); err != nil {
		return nil, fmt.Errorf("node archive: %w", err)
	}
	return buf.Bytes(), nil
}

// WriteNodeConfig writes a node's configuration archive (NodeArchive) to
// path, mode 0600.
func WriteNodeConfig(path string, cfg NodeConfig) error {
	b, err := NodeArchive(cfg)
	if err != nil {
		return err
	}
	return writeFileAtomic(path, b, 0o600)
}

// WriteNodeInitrd writes the complete initrd of one node to path (mode
// 0600): the base initramfs, zero padding to a 4-byte boundary, and the
// node's configuration archive. The kernel unpacks both in order.
func WriteNodeInitrd(path, base string, cfg NodeConfig) error {
	node, err := NodeArchive(cfg)
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
