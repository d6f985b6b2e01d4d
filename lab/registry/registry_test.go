package registry

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// serve opens the registry on dir and serves it (read-write) on loopback.
func serve(t *testing.T, dir string) (host string) {
	t.Helper()
	r, err := Open(dir, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewServer(r.ReadWrite())
	t.Cleanup(s.Close)
	return strings.TrimPrefix(s.URL, "http://")
}

// push writes img as HOST/repo:tag into the registry at reg, as labcloud
// load does.
func push(t *testing.T, reg, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	to, err := name.ParseReference(reg+"/"+Namespace(r.Context().RegistryStr())+"/"+r.Context().RepositoryStr()+":"+r.Identifier(), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(to, img); err != nil {
		t.Fatalf("push %s: %v", to, err)
	}
}

// mirrorGet fetches /v2/REPO/KIND/REF?ns=NS as containerd's mirror
// requests do, and says its status and digest header.
func mirrorGet(t *testing.T, reg, ns, repo, kind, ref string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+reg+"/v2/"+repo+"/"+kind+"/"+ref+"?ns="+ns, nil)
	req.Header.Set("Accept", "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if kind == "blobs" && resp.StatusCode == http.StatusOK {
		if h, _, _ := v1.SHA256(strings.NewReader(string(b))); h.String() != ref {
			t.Errorf("blob %s?ns=%s served content of digest %s", ref, ns, h)
		}
	}
	return resp.StatusCode, resp.Header.Get("Docker-Content-Digest")
}

func digest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestMirrorPullsByNamespace(t *testing.T) {
	reg := serve(t, t.TempDir())
	a, _ := random.Image(1024, 2)
	b, _ := random.Image(1024, 1)
	// The same repository and tag from two registries, and Docker Hub's
	// short name.
	push(t, reg, "example.invalid/x/app:v1", a)
	push(t, reg, "other.invalid:5000/x/app:v1", b)
	push(t, reg, "app:v1", b)

	for _, c := range []struct {
		ns, repo string
		want     v1.Image
	}{
		{"example.invalid", "x/app", a},
		{"other.invalid:5000", "x/app", b},
		{"docker.io", "library/app", b},
	} {
		code, got := mirrorGet(t, reg, c.ns, c.repo, "manifests", "v1")
		if want := digest(t, c.want).String(); code != http.StatusOK || got != want {
			t.Errorf("GET %s/manifests/v1?ns=%s: %d digest %q, want 200 %s", c.repo, c.ns, code, got, want)
		}
		layers, _ := c.want.Layers()
		ld, _ := layers[0].Digest()
		if code, _ := mirrorGet(t, reg, c.ns, c.repo, "blobs", ld.String()); code != http.StatusOK {
			t.Errorf("GET %s/blobs/%s?ns=%s: %d, want 200", c.repo, ld, c.ns, code)
		}
	}
	// A name nobody loaded is a 404, which sends containerd on to the
	// next host (the real registry).
	if code, _ := mirrorGet(t, reg, "example.invalid", "x/nothing", "manifests", "v1"); code != http.StatusNotFound {
		t.Errorf("an image nobody loaded: %d, want 404", code)
	}
	if code, _ := mirrorGet(t, reg, "bad/host", "x/app", "manifests", "v1"); code != http.StatusBadRequest {
		t.Errorf("ns=bad/host: %d, want 400", code)
	}
}

func TestRestartKeepsEveryImage(t *testing.T) {
	dir := t.TempDir()
	reg := serve(t, dir)
	img, _ := random.Image(2048, 2)
	idx, _ := random.Index(512, 1, 2)
	push(t, reg, "example.invalid/x/app:v1", img)
	ref, _ := name.ParseReference(reg+"/example.invalid/x/multi:v2", name.Insecure)
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
	// Retagged: the newer manifest wins after the restart too.
	img2, _ := random.Image(2048, 1)
	push(t, reg, "example.invalid/x/app:v1", img2)

	again := serve(t, dir) // a new handler on the same directory
	got, err := remote.Image(mustRef(t, again+"/example.invalid/x/app:v1"))
	if err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	if d := digest(t, got); d != digest(t, img2) {
		t.Errorf("after a restart app:v1 is %s, want the last pushed %s", d, digest(t, img2))
	}
	if err := validateImage(got); err != nil {
		t.Errorf("after a restart: %v", err)
	}
	gotIdx, err := remote.Index(mustRef(t, again+"/example.invalid/x/multi:v2"))
	if err != nil {
		t.Fatalf("the index after a restart: %v", err)
	}
	want, _ := idx.Digest()
	if d, _ := gotIdx.Digest(); d != want {
		t.Errorf("the index after a restart is %s, want %s", d, want)
	}
	// By digest, as the kubelet pulls an image it resolved.
	if _, err := remote.Image(mustRef(t, again+"/example.invalid/x/app@"+digest(t, img).String())); err != nil {
		t.Errorf("the first app:v1 by digest after a restart: %v", err)
	}
}

func TestReadOnlyRefusesPushes(t *testing.T) {
	r, err := Open(t.TempDir(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewServer(r.ReadOnly())
	defer s.Close()
	img, _ := random.Image(256, 1)
	to := mustRef(t, strings.TrimPrefix(s.URL, "http://")+"/example.invalid/x/app:v1")
	err = remote.Write(to, img)
	if err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("a push to the read-only handler: %v, want refused as read-only", err)
	}
}

func TestNamespace(t *testing.T) {
	for host, want := range map[string]string{
		"index.docker.io":    "docker.io",
		"docker.io":          "docker.io",
		"Example.Invalid":    "example.invalid",
		"localhost:5000":     "localhost_5000",
		"[fd00:10:123::1]:5": "fd00_10_123__1_5",
		"quay.io":            "quay.io",
	} {
		if got := Namespace(host); got != want {
			t.Errorf("Namespace(%q) = %q, want %q", host, got, want)
		}
		if _, err := name.NewRepository(Namespace(host) + "/x/app"); err != nil {
			t.Errorf("Namespace(%q)/x/app is not a repository: %v", host, err)
		}
	}
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func validateImage(img v1.Image) error { return validate.Image(img) }
