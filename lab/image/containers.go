package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The container images lab nodes import at boot, under the names Kubernetes
// 1.36.3 and its e2e suite use (test/utils/image/manifest.go, and containerd
// 2.4's sandbox image). Tagged images are pulled IfNotPresent, so with these
// present nothing is ever pulled.
const (
	PauseImage   = "registry.k8s.io/pause:3.10.2"
	AgnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.63.0"
)

// imagesVersion changes whenever an image recipe changes (part of the disk key).
const imagesVersion = "pause+agnhost/5"

// agnhostPrograms are host programs the e2e tests exec inside agnhost
// besides busybox's applets (seq, ...), by their path in the image. GNU
// wget replaces busybox's, which crashes in Debian's static build;
// netcat-openbsd is the nc upstream's agnhost carries (the probes use its
// -v and -t, which busybox's small nc refuses); dash is /bin/sh because
// busybox's shell runs its own applets before PATH, so `sh -c wget` would
// still reach the crashing one.
var agnhostPrograms = map[string]string{
	"/usr/bin/curl": "/usr/bin/curl",
	"/usr/bin/wget": "/usr/bin/wget",
	"/usr/bin/nc":   "/bin/nc.openbsd",
	"/bin/dash":     "/bin/dash",
}

// writeImages writes one docker-archive tarball per image into dir, the
// format `ctr images import` reads.
func writeImages(dir string, opts DiskOptions) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	pause, err := pauseLayer(opts.Tools)
	if err != nil {
		return err
	}
	agnhost, err := agnhostLayer(opts)
	if err != nil {
		return err
	}
	images := []struct {
		file, ref string
		layer     []byte
		cfg       v1.Config
	}{
		{"pause.tar", PauseImage, pause, v1.Config{Entrypoint: []string{"/pause"}, User: "65535:65535"}},
		{"agnhost.tar", AgnhostImage, agnhost, v1.Config{
			Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"},
			Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		}},
	}
	for _, im := range images {
		img, err := singleLayerImage(im.layer, im.cfg)
		if err != nil {
			return fmt.Errorf("image %s: %w", im.ref, err)
		}
		ref, err := name.NewTag(im.ref)
		if err != nil {
			return err
		}
		if err := tarball.WriteToFile(filepath.Join(dir, im.file), ref, img); err != nil {
			return fmt.Errorf("write image %s: %w", im.ref, err)
		}
	}
	return nil
}

// singleLayerImage is a linux/amd64 image of one layer (an uncompressed tar).
func singleLayerImage(layerTar []byte, cfg v1.Config) (v1.Image, error) {
	// Stored, not compressed: a TCG guest imports the images at every boot,
	// and gunzip is where its time went.
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithCompressionLevel(gzip.NoCompression))
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", "amd64", cfg
	return mutate.ConfigFile(img, cf)
}

// pauseLayer holds the pause binary hack/build-tools.sh builds from
// Kubernetes' build/pause/linux/pause.c.
func pauseLayer(tools string) ([]byte, error) {
	p := filepath.Join(tools, "pause")
	if err := checkStatic(p, "pause"); err != nil {
		return nil, fmt.Errorf("%w (run hack/build-tools.sh)", err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	l := layerTree{}
	l.file("pause", 0o755, b)
	return l.tar()
}

// agnhostLayer holds agnhost, busybox with its applets, dash as /bin/sh,
// curl, wget and nc with their libraries, and the files a container expects
// in /etc.
func agnhostLayer(opts DiskOptions) ([]byte, error) {
	l := layerTree{}
	ag := filepath.Join(opts.Tools, "agnhost")
	if err := checkStatic(ag, "agnhost"); err != nil {
		return nil, fmt.Errorf("%w (run hack/build-tools.sh)", err)
	}
	if err := l.hostFile("agnhost", ag, 0o755); err != nil {
		return nil, err
	}
	bb := opts.Busybox
	if bb == "" {
		bb = DefaultBusybox
	}
	if err := l.hostFile("bin/busybox", bb, 0o755); err != nil {
		return nil, err
	}
	applets, err := busyboxApplets(context.Background(), bb)
	if err != nil {
		return nil, err
	}
	replaced := map[string]bool{"sh": true}
	for p := range agnhostPrograms {
		replaced[path.Base(p)] = true
	}
	for _, a := range applets {
		if a = clean(a); a != "bin/busybox" && a != "linuxrc" && !replaced[path.Base(a)] {
			l.symlink(a, "/bin/busybox")
		}
	}
	for _, p := range sortedKeys(agnhostPrograms) {
		prog := agnhostPrograms[p]
		if err := l.hostFile(clean(p), prog, 0o755); err != nil {
			return nil, fmt.Errorf("%w (run hack/install-deps.sh)", err)
		}
		libs, err := sharedLibraries(context.Background(), prog)
		if err != nil {
			return nil, err
		}
		for _, lib := range libs {
			if err := l.hostFile(clean(lib), lib, 0o755); err != nil {
				return nil, err
			}
		}
	}
	l.symlink("bin/sh", "/bin/dash")
	l.file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"))
	l.file("etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n"))
	l.file("etc/nsswitch.conf", 0o644, []byte("hosts: files dns\n"))
	// One try, as busybox's wget: a probe that must fail is not retried
	// for minutes.
	l.file("etc/wgetrc", 0o644, []byte("tries = 1\n"))
	l.dir("tmp", 0o1777)
	return l.tar()
}

// layerTree is the content of an image layer, keyed by path.
type layerTree map[string]layerEntry

type layerEntry struct {
	mode int64
	typ  byte
	data []byte
	link string
}

func (l layerTree) parents(p string) {
	for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
		if _, ok := l[d]; !ok {
			l[d] = layerEntry{mode: 0o755, typ: tar.TypeDir}
		}
	}
}

func (l layerTree) dir(p string, mode int64) {
	l.parents(p)
	l[p] = layerEntry{mode: mode, typ: tar.TypeDir}
}

func (l layerTree) file(p string, mode int64, data []byte) {
	l.parents(p)
	l[p] = layerEntry{mode: mode, typ: tar.TypeReg, data: data}
}

func (l layerTree) symlink(p, target string) {
	l.parents(p)
	l[p] = layerEntry{mode: 0o777, typ: tar.TypeSymlink, link: target}
}

// hostFile adds a host file's content (symlinks followed) at p.
func (l layerTree) hostFile(p, src string, mode int64) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	l.file(p, mode, b)
	return nil
}

// tar writes the layer in path order, owner root, zero timestamps.
func (l layerTree) tar() ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range sortedKeys(l) {
		e := l[p]
		h := &tar.Header{Name: p, Mode: e.mode, Typeflag: e.typ, Linkname: e.link, Size: int64(len(e.data)), Format: tar.FormatPAX}
		if e.typ == tar.TypeDir {
			h.Name = strings.TrimSuffix(p, "/") + "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
