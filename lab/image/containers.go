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
	"slices"
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
	PauseImage           = "registry.k8s.io/pause:3.10.2"
	AgnhostImage         = "registry.k8s.io/e2e-test-images/agnhost:2.63.0"
	GlibcDNSTestingImage = "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0"
	NginxImage           = "registry.k8s.io/e2e-test-images/nginx:1.15-4"
)

// The images kubeadm 1.36.3 runs besides pause (`kubeadm config images
// list`), for guests that run `kubeadm init` and `join` with nothing to
// pull: KubeadmImages, WriteImages.
const (
	KubeAPIServerImage         = "registry.k8s.io/kube-apiserver:v1.36.3"
	KubeControllerManagerImage = "registry.k8s.io/kube-controller-manager:v1.36.3"
	KubeSchedulerImage         = "registry.k8s.io/kube-scheduler:v1.36.3"
	KubeProxyImage             = "registry.k8s.io/kube-proxy:v1.36.3"
	CoreDNSImage               = "registry.k8s.io/coredns/coredns:v1.14.2"
	EtcdImage                  = "registry.k8s.io/etcd:3.6.8-0"
)

// imagesVersion changes whenever a recipe of the node disk's images
// (containerImages) changes: it is part of the disk key.
const imagesVersion = "pause+agnhost+glibc-dns-testing+nginx/7"

// containerImage is one image of the node disk: its archive's file name,
// its reference, what its one layer holds and how it runs.
type containerImage struct {
	file, ref string
	layer     *layerRecipe
	cfg       v1.Config
}

var pathEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// containerImages are the images the node disk carries.
//
// glibc-dns-testing is the DNS tests' "jessie" prober: `sh -c` with dig,
// getent, seq, test, echo and sleep. It shares agnhost's layer, which holds
// all of that for the same tests' agnhost prober: containerd stores and
// unpacks a layer two images name once, and unpacked layers live in each
// node's memory (dig's libraries are 43 MB). Its config is Debian's
// image's, sh for bash; the tests always give a command.
//
// nginx runs as upstream's nginx:1.15 does: in the foreground, on port 80.
var containerImages = []containerImage{
	{"pause.tar", PauseImage, &pauseRecipe, v1.Config{Entrypoint: []string{"/pause"}, User: "65535:65535"}},
	{"agnhost.tar", AgnhostImage, &agnhostRecipe, v1.Config{Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, Env: pathEnv}},
	{"glibc-dns-testing.tar", GlibcDNSTestingImage, &agnhostRecipe, v1.Config{Cmd: []string{"sh"}, Env: pathEnv}},
	{"nginx.tar", NginxImage, &nginxRecipe, v1.Config{Cmd: []string{"nginx", "-g", "daemon off;"}, Env: pathEnv}},
}

// layerRecipe is what an image layer holds.
type layerRecipe struct {
	tools    map[string]string // path in the image: static program hack/build-tools.sh builds
	toolData []string          // files hack/build-tools.sh copies, at / by their base name
	busybox  bool              // Debian's static busybox with its applets
	programs map[string]string // path in the image: host program, with its shared libraries
	// Host directories of shared objects programs load at run time (ldd
	// does not name them), at their host paths, with their libraries.
	pluginDirs []string
	links      map[string]string // path: target
	files      map[string]string // path: content
	dirs       map[string]int64  // path: mode
}

var pauseRecipe = layerRecipe{tools: map[string]string{"pause": "pause"}}

// agnhostRecipe: agnhost, busybox with its applets, and host programs the
// e2e tests exec inside agnhost besides busybox's applets (seq, ...). GNU
// wget replaces busybox's, which crashes in Debian's static build;
// netcat-openbsd is the nc upstream's agnhost carries (the probes use its
// -v and -t, which busybox's small nc refuses); dash is /bin/sh because
// busybox's shell runs its own applets before PATH, so `sh -c wget` would
// still reach the crashing one. The DNS tests' probes run dig (upstream's
// agnhost has bind-tools) and getent, which reads the kubelet's /etc/hosts
// through glibc.
var agnhostRecipe = layerRecipe{
	tools: map[string]string{"agnhost": "agnhost"},
	// porter's TLS pair, read from its working directory.
	toolData: []string{"porter/localhost.crt", "porter/localhost.key"},
	busybox:  true,
	programs: map[string]string{
		"/usr/bin/curl":   "/usr/bin/curl",
		"/usr/bin/wget":   "/usr/bin/wget",
		"/usr/bin/nc":     "/bin/nc.openbsd",
		"/bin/dash":       "/bin/dash",
		"/usr/bin/dig":    "/usr/bin/dig",
		"/usr/bin/getent": "/usr/bin/getent",
	},
	links: map[string]string{"bin/sh": "/bin/dash"},
	files: withEtc(map[string]string{
		// One try, as busybox's wget: a probe that must fail is not
		// retried for minutes.
		"etc/wgetrc": "tries = 1\n",
	}),
	dirs: map[string]int64{"tmp": 0o1777},
}

// nginxRecipe: Debian's nginx serving a page on port 80, its workers as
// nobody, logging to stdout and stderr, as upstream's image does.
var nginxRecipe = layerRecipe{
	programs: map[string]string{"/usr/sbin/nginx": "/usr/sbin/nginx"},
	files: withEtc(map[string]string{
		"etc/nginx/nginx.conf": "user nobody nogroup;\nworker_processes 1;\nevents {\n\tworker_connections 128;\n}\n" +
			"http {\n\taccess_log /dev/stdout;\n\tdefault_type text/html;\n" +
			"\tserver {\n\t\tlisten 80;\n\t\troot /usr/share/nginx/html;\n\t}\n}\n",
		"usr/share/nginx/html/index.html": "<!DOCTYPE html>\n<title>Welcome to nginx!</title>\n<h1>Welcome to nginx!</h1>\n",
	}),
	// Where it writes its pid and makes its temporary directories.
	dirs: map[string]int64{"run": 0o755, "var/lib/nginx": 0o755},
}

// withEtc adds the files a container expects in /etc: root and nobody,
// and glibc's host lookups in /etc/hosts (the kubelet's), then DNS.
func withEtc(files map[string]string) map[string]string {
	files["etc/passwd"] = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
	files["etc/group"] = "root:x:0:\nnogroup:x:65534:\n"
	files["etc/nsswitch.conf"] = "hosts: files dns\n"
	return files
}

// nodeImageRefs are the node disk's images.
func nodeImageRefs() []string {
	refs := make([]string, len(containerImages))
	for i, im := range containerImages {
		refs[i] = im.ref
	}
	return refs
}

// WriteImages writes a docker-archive tarball of each image refs names
// into dir, the format `ctr images import` reads, and returns their paths
// in the same order. The images are the node disk's (PauseImage, ...) and
// kubeadm's (KubeadmImages); their programs come from opts.Tools and
// opts.Busybox. Images that share a recipe share its layer, byte for byte.
func WriteImages(dir string, opts DiskOptions, refs ...string) ([]string, error) {
	images := make([]containerImage, len(refs))
	uses := map[*layerRecipe]int{} // a layer is held while an image to come needs it
	for i, ref := range refs {
		im, ok := knownImage(ref)
		if !ok {
			return nil, fmt.Errorf("image %s: the lab builds no such image", ref)
		}
		images[i] = im
		uses[im.layer]++
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	layers := map[*layerRecipe][]byte{}
	paths := make([]string, len(refs))
	for i, im := range images {
		if layers[im.layer] == nil {
			l, err := im.layer.build(opts)
			if err != nil {
				return nil, fmt.Errorf("image %s: %w", im.ref, err)
			}
			layers[im.layer] = l
		}
		img, err := singleLayerImage(layers[im.layer], im.cfg)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", im.ref, err)
		}
		tag, err := name.NewTag(im.ref)
		if err != nil {
			return nil, err
		}
		paths[i] = filepath.Join(dir, im.file)
		if err := tarball.WriteToFile(paths[i], tag, img); err != nil {
			return nil, fmt.Errorf("write image %s: %w", im.ref, err)
		}
		if uses[im.layer]--; uses[im.layer] == 0 {
			delete(layers, im.layer)
		}
	}
	return paths, nil
}

// knownImage is the image ref names, of the node disk's or kubeadm's.
func knownImage(ref string) (containerImage, bool) {
	for _, im := range slices.Concat(containerImages, kubeadmImages) {
		if im.ref == ref {
			return im, true
		}
	}
	return containerImage{}, false
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

// build lays out the recipe's layer: static tools from opts.Tools (pause,
// agnhost, kube-apiserver...: hack/build-tools.sh builds them), busybox's
// applets but those a program or link replaces, host programs and plugins
// with the libraries ldd names.
func (r *layerRecipe) build(opts DiskOptions) ([]byte, error) {
	l := layerTree{}
	for _, p := range sortedKeys(r.tools) {
		t := r.tools[p]
		src := filepath.Join(opts.Tools, t)
		if err := checkStatic(src, t); err != nil {
			return nil, fmt.Errorf("%w (run hack/build-tools.sh)", err)
		}
		if err := l.hostFile(clean(p), src, 0o755); err != nil {
			return nil, err
		}
	}
	for _, t := range r.toolData {
		if err := l.hostFile(path.Base(t), filepath.Join(opts.Tools, t), 0o644); err != nil {
			return nil, fmt.Errorf("%w (run hack/build-tools.sh)", err)
		}
	}
	if r.busybox {
		if err := l.busybox(opts.Busybox, r.replaced()); err != nil {
			return nil, err
		}
	}
	for _, p := range sortedKeys(r.programs) {
		if err := l.withLibraries(p, r.programs[p]); err != nil {
			return nil, err
		}
	}
	for _, d := range r.pluginDirs {
		plugins, err := filepath.Glob(filepath.Join(d, "*.so"))
		if err != nil || len(plugins) == 0 {
			return nil, fmt.Errorf("no plugins in %s (run hack/install-deps.sh)", d)
		}
		for _, p := range plugins {
			if err := l.withLibraries(p, p); err != nil {
				return nil, err
			}
		}
	}
	for p, target := range r.links {
		l.symlink(p, target)
	}
	for p, content := range r.files {
		l.file(p, 0o644, []byte(content))
	}
	for p, mode := range r.dirs {
		l.dir(p, mode)
	}
	return l.tar()
}

// withLibraries adds the host program (or shared object) prog at p, and
// the libraries ldd says it loads at their host paths.
func (l layerTree) withLibraries(p, prog string) error {
	if err := l.hostFile(clean(p), prog, 0o755); err != nil {
		return fmt.Errorf("%w (run hack/install-deps.sh)", err)
	}
	libs, err := sharedLibraries(context.Background(), prog)
	if err != nil {
		return err
	}
	for _, lib := range libs {
		if err := l.hostFile(clean(lib), lib, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// replaced are the command names the recipe's programs and links take
// from busybox.
func (r *layerRecipe) replaced() map[string]bool {
	names := map[string]bool{}
	for _, m := range []map[string]string{r.programs, r.links} {
		for p := range m {
			names[path.Base(p)] = true
		}
	}
	return names
}

// busybox adds Debian's static busybox (bb, default DefaultBusybox) with a
// link for each applet not in replaced.
func (l layerTree) busybox(bb string, replaced map[string]bool) error {
	if bb == "" {
		bb = DefaultBusybox
	}
	if err := l.hostFile("bin/busybox", bb, 0o755); err != nil {
		return err
	}
	applets, err := busyboxApplets(context.Background(), bb)
	if err != nil {
		return err
	}
	for _, a := range applets {
		if a = clean(a); a != "bin/busybox" && a != "linuxrc" && !replaced[path.Base(a)] {
			l.symlink(a, "/bin/busybox")
		}
	}
	return nil
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
