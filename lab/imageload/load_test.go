package imageload

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/labcloud/labcloud/lab/registry"
)

// lab is a registry on loopback as the lab's push address serves it.
type lab struct {
	addr, dir string
}

func newLab(t *testing.T) lab {
	t.Helper()
	dir := t.TempDir()
	r, err := registry.Open(dir, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewServer(r.ReadWrite())
	t.Cleanup(s.Close)
	return lab{addr: strings.TrimPrefix(s.URL, "http://"), dir: dir}
}

// load runs Load into l and returns what it printed.
func (l lab) load(t *testing.T, opts Options) (string, error) {
	t.Helper()
	var out bytes.Buffer
	opts.Registry, opts.Transport, opts.Out = l.addr, http.DefaultTransport, &out
	err := Load(context.Background(), opts)
	return out.String(), err
}

// digestOf is the digest the lab serves for ref, or "" when it has none.
func (l lab) digestOf(t *testing.T, ref string) string {
	t.Helper()
	to, err := Target(l.addr, mustTag(t, ref))
	if err != nil {
		t.Fatal(err)
	}
	d, err := remote.Head(to)
	if err != nil {
		return ""
	}
	return d.Digest.String()
}

// empty says the lab stores nothing: no blob, no manifest.
func (l lab) stored(t *testing.T) []string {
	t.Helper()
	blobs, _ := filepath.Glob(filepath.Join(l.dir, "blobs", "sha256", "*"))
	manifests, _ := filepath.Glob(filepath.Join(l.dir, "manifests", "*.json"))
	return append(blobs, manifests...)
}

func randomImage(t *testing.T) v1.Image {
	t.Helper()
	img, err := random.Image(8192, 2)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func digest(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// dockerArchive writes images as docker save does, each under its tags.
func dockerArchive(t *testing.T, images map[string]v1.Image) string {
	t.Helper()
	refs := map[name.Reference]v1.Image{}
	for s, img := range images {
		refs[mustTag(t, s)] = img
	}
	p := filepath.Join(t.TempDir(), "docker.tar")
	if err := tarball.MultiRefWriteToFile(p, refs); err != nil {
		t.Fatal(err)
	}
	return p
}

// ociArchive writes img as an OCI layout tar, named by annotations.
func ociArchive(t *testing.T, img v1.Image, annotations map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(annotations)); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "oci.tar")
	cmd := exec.Command("tar", "-C", dir, "-cf", out, ".")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, b)
	}
	return out
}

// rewriteTar copies src's entries with f's contents (nil drops it).
func rewriteTar(t *testing.T, src string, f func(name string, b []byte) []byte) string {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	dst := filepath.Join(t.TempDir(), "rewritten.tar")
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	tr, tw := tar.NewReader(in), tar.NewWriter(out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		if b = f(h.Name, b); b == nil {
			continue
		}
		h.Size = int64(len(b))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write(b)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestLoadArchives(t *testing.T) {
	l := newLab(t)
	a, b, c := randomImage(t), randomImage(t), randomImage(t)
	// One docker save of two images, one with two tags; an OCI layout
	// named as buildah names it.
	docker := dockerArchive(t, map[string]v1.Image{"example.invalid/acc/app:ci": a, "app:ci": b, "app:v2": b})
	oci := ociArchive(t, c, map[string]string{ociNameAnnotation: "example.invalid/acc/oci:v1"})
	out, err := l.load(t, Options{Archives: []string{docker, oci}})
	if err != nil {
		t.Fatalf("load: %v\n%s", err, out)
	}
	for ref, img := range map[string]v1.Image{"example.invalid/acc/app:ci": a, "app:ci": b, "docker.io/library/app:v2": b, "example.invalid/acc/oci:v1": c} {
		if got, want := l.digestOf(t, ref), digest(t, img); got != want {
			t.Errorf("%s: the lab serves %q, want %s", ref, got, want)
		}
		if !strings.Contains(out, digest(t, img)) {
			t.Errorf("the output does not give %s's digest %s:\n%s", ref, digest(t, img), out)
		}
	}
	// Again: nothing to push.
	out, err = l.load(t, Options{Archives: []string{docker, oci}})
	if err != nil {
		t.Fatalf("load again: %v\n%s", err, out)
	}
	if n := strings.Count(out, "already loaded"); n != 4 {
		t.Errorf("loading again said \"already loaded\" %d times, want 4:\n%s", n, out)
	}
}

func TestLoadRefusesBadInputAndLoadsNothing(t *testing.T) {
	good := dockerArchive(t, map[string]v1.Image{"example.invalid/acc/good:v1": randomImage(t)})
	bad := dockerArchive(t, map[string]v1.Image{"example.invalid/acc/bad:v1": randomImage(t)})
	raw, err := os.ReadFile(bad)
	if err != nil {
		t.Fatal(err)
	}
	truncated := filepath.Join(t.TempDir(), "truncated.tar")
	if err := os.WriteFile(truncated, raw[:len(raw)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	// A layer whose content is not what the manifest's digest says.
	other := randomImage(t)
	ol, _ := other.Layers()
	otherLayer, _ := ol[0].Compressed()
	otherBytes, _ := io.ReadAll(otherLayer)
	lying := rewriteTar(t, bad, func(n string, b []byte) []byte {
		if strings.HasSuffix(n, ".tar.gz") {
			return otherBytes
		}
		return b
	})
	badRef := rewriteTar(t, bad, func(n string, b []byte) []byte {
		if n == "manifest.json" {
			return bytes.ReplaceAll(b, []byte("example.invalid/acc/bad:v1"), []byte("Example Invalid/bad:v1"))
		}
		return b
	})
	unnamed := ociArchive(t, randomImage(t), nil)
	bareTag := ociArchive(t, randomImage(t), map[string]string{ociNameAnnotation: "v1"})
	notTar := filepath.Join(t.TempDir(), "notes.txt")
	_ = os.WriteFile(notTar, []byte("not an image\n"), 0o600)

	for _, c := range []struct {
		name, file, want string
	}{
		{"truncated tar", truncated, "truncated.tar"},
		{"layer digest lies", lying, "corrupt"},
		{"name not a reference", badRef, "not a reference"},
		{"OCI image without a name", unnamed, "has no name"},
		{"OCI name without a tag", bareTag, "not a reference"},
		{"not a tar", notTar, "notes.txt"},
		{"missing file", filepath.Join(t.TempDir(), "absent.tar"), "absent.tar"},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newLab(t)
			// The good archive comes first: it must not be loaded either.
			out, err := l.load(t, Options{Archives: []string{good, c.file}})
			if err == nil {
				t.Fatalf("loaded:\n%s", out)
			}
			if !strings.Contains(err.Error(), c.file) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q, want it to name %s and say %q", err, c.file, c.want)
			}
			if s := l.stored(t); len(s) > 0 {
				t.Errorf("the lab stores %d files after a refused load: %v", len(s), s)
			}
		})
	}
}

// TestLoadImageFromStores reads images from a real Podman store (a
// temporary one) after asking Docker, as labcloud load image does.
func TestLoadImageFromStores(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: podman's store")
	}
	if _, err := exec.LookPath("podman"); err != nil {
		t.Skip("podman is not installed")
	}
	dir := t.TempDir()
	podman := []string{"podman", "--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"), "--storage-driver", "vfs"}
	stores := []Store{cliStore("Docker", "docker", "--host", "unix://"+filepath.Join(dir, "no-docker.sock")), cliStore("Podman", podman...)}
	l := newLab(t)

	_, err := l.load(t, Options{Images: []string{"example.invalid/acc/app:ci"}, Stores: stores})
	if err == nil || !strings.Contains(err.Error(), "example.invalid/acc/app:ci") || !strings.Contains(err.Error(), "Docker") || !strings.Contains(err.Error(), "Podman") {
		t.Errorf("a missing image: %v, want an error naming it and the stores asked", err)
	}
	if _, err := l.load(t, Options{Images: []string{"Not A Name"}, Stores: stores}); err == nil || !strings.Contains(err.Error(), "Not A Name") {
		t.Errorf("a name that is not a reference: %v, want an error naming it", err)
	}
	if s := l.stored(t); len(s) > 0 {
		t.Fatalf("the lab stores %d files after refused loads: %v", len(s), s)
	}

	img := randomImage(t)
	tarFile := dockerArchive(t, map[string]v1.Image{"example.invalid/acc/app:ci": img})
	if b, err := exec.Command(podman[0], append(podman[1:], "load", "-i", tarFile)...).CombinedOutput(); err != nil {
		t.Fatalf("podman load: %v: %s", err, b)
	}
	out, err := l.load(t, Options{Images: []string{"example.invalid/acc/app:ci"}, Stores: stores})
	if err != nil {
		t.Fatalf("load image from Podman: %v\n%s", err, out)
	}
	// Podman may rewrite the manifest; the image (its config) is the same.
	to, _ := Target(l.addr, mustTag(t, "example.invalid/acc/app:ci"))
	got, err := remote.Image(to)
	if err != nil {
		t.Fatalf("the loaded image: %v", err)
	}
	gotCfg, _ := got.ConfigName()
	wantCfg, _ := img.ConfigName()
	if gotCfg != wantCfg {
		t.Errorf("loaded config %s, want %s", gotCfg, wantCfg)
	}
}

func mustTag(t *testing.T, s string) name.Tag {
	t.Helper()
	tag, err := name.NewTag(s)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}
