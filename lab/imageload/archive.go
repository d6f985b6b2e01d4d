// Package imageload reads images from the host (docker-archive and OCI
// layout tars, Docker's, Podman's or containerd's store), validates every
// one, and pushes them to the lab's registry (lab/registry) by their own
// names, which every node's containerd pulls them by.
package imageload

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Image is one image to load, under one name.
type Image struct {
	Name  name.Tag
	Image v1.Image
	From  string // the input it came from, for messages
}

// Annotations naming an image in an OCI layout: containerd's export puts
// the full name in its own and the tag alone in the OCI one; buildah and
// skopeo put the name they were given in the OCI one.
const (
	containerdNameAnnotation = "io.containerd.image.name"
	ociNameAnnotation        = "org.opencontainers.image.ref.name"
)

// parseName reads a name an archive gives an image: a reference with an
// explicit tag, as docker save's RepoTags are (a bare "v1", as some OCI
// layouts name images, would otherwise be docker.io/library/v1:latest).
func parseName(s, from string) (name.Tag, error) {
	t, err := name.NewTag(s)
	if err == nil && !strings.Contains(s[strings.LastIndex(s, "/")+1:], ":") {
		err = errors.New("no tag")
	}
	if err != nil {
		return name.Tag{}, fmt.Errorf("%s: image name %q is not a reference NAME:TAG: %w", from, s, err)
	}
	return t, nil
}

// readArchive reads every image of a docker-archive or OCI layout tar.
// Files an OCI layout needs unpacking into go under tmp.
func readArchive(file, tmp string) ([]Image, error) {
	names, err := tarNames(file)
	if err != nil {
		return nil, fmt.Errorf("%s: not a readable tar: %w", file, err)
	}
	switch {
	case names["manifest.json"]: // docker save (also with an OCI layout since Docker 25), ko, podman
		return readDockerArchive(file)
	case names["index.json"] && names["oci-layout"]:
		dir, err := os.MkdirTemp(tmp, "oci-")
		if err != nil {
			return nil, err
		}
		if err := untar(file, dir); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		return readOCILayout(dir, file)
	}
	return nil, fmt.Errorf("%s: neither a docker-archive (no manifest.json) nor an OCI image layout (no index.json and oci-layout)", file)
}

// tarNames are the names of the files in a tar, cleaned; reading it to the
// end finds a truncated one.
func tarNames(file string) (map[string]bool, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names := map[string]bool{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if len(names) == 0 {
				return nil, errors.New("empty")
			}
			return names, nil
		}
		if err != nil {
			return nil, err
		}
		names[path.Clean(h.Name)] = true
	}
}

func readDockerArchive(file string) ([]Image, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(file) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, fmt.Errorf("%s: manifest.json: %w", file, err)
	}
	var out []Image
	for i, d := range m {
		if len(d.RepoTags) == 0 {
			return nil, fmt.Errorf("%s: image %d of %d (config %s) has no name: save it by name (docker save NAME:TAG), not by ID", file, i+1, len(m), d.Config)
		}
		for _, s := range d.RepoTags {
			t, err := parseName(s, file)
			if err != nil {
				return nil, err
			}
			img, err := tarball.Image(opener, &t)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", file, s, err)
			}
			out = append(out, Image{Name: t, Image: img, From: file})
		}
	}
	return out, nil
}

// readOCILayout reads the named images of the OCI layout in dir (from
// file); of a multi-platform index, the image for this machine's platform.
func readOCILayout(dir, file string) ([]Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%s: index.json: %w", file, err)
	}
	if len(im.Manifests) == 0 {
		return nil, fmt.Errorf("%s: the OCI layout holds no image", file)
	}
	var out []Image
	for i, d := range im.Manifests {
		s := d.Annotations[containerdNameAnnotation]
		if s == "" {
			s = d.Annotations[ociNameAnnotation]
		}
		if s == "" {
			return nil, fmt.Errorf("%s: image %d of %d (%s) has no name (annotation %s)", file, i+1, len(im.Manifests), d.Digest, ociNameAnnotation)
		}
		t, err := parseName(s, file)
		if err != nil {
			return nil, err
		}
		img, err := layoutImage(idx, d)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", file, s, err)
		}
		out = append(out, Image{Name: t, Image: img, From: file})
	}
	return out, nil
}

// layoutImage is the image d names: itself, or of an index the one for
// this machine (linux/GOARCH), as the nodes would pick.
func layoutImage(idx v1.ImageIndex, d v1.Descriptor) (v1.Image, error) {
	if d.MediaType.IsImage() {
		return idx.Image(d.Digest)
	}
	if !d.MediaType.IsIndex() {
		return nil, fmt.Errorf("%s is a %s, not an image", d.Digest, d.MediaType)
	}
	sub, err := idx.ImageIndex(d.Digest)
	if err != nil {
		return nil, err
	}
	im, err := sub.IndexManifest()
	if err != nil {
		return nil, err
	}
	want := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	for _, m := range im.Manifests {
		if m.MediaType.IsImage() && m.Platform != nil && m.Platform.Satisfies(want) {
			return sub.Image(m.Digest)
		}
	}
	return nil, fmt.Errorf("the index %s has no image for %s/%s", d.Digest, want.OS, want.Architecture)
}

// untar unpacks an OCI layout tar into dir: regular files and directories
// only, none outside dir.
func untar(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := path.Clean(h.Name)
		if path.IsAbs(p) || p == ".." || strings.HasPrefix(p, "../") {
			return fmt.Errorf("entry %q is outside the archive", h.Name)
		}
		dst := filepath.Join(dir, filepath.FromSlash(p))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(dst, 0o700)
		case tar.TypeReg:
			err = writeFile(dst, tr)
		default:
			err = fmt.Errorf("entry %q: only files and directories belong in an OCI layout", h.Name)
		}
		if err != nil {
			return err
		}
	}
}

func writeFile(dst string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
