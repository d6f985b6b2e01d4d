package image

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"sigs.k8s.io/yaml"

	"github.com/labcloud/labcloud/lab/controlplane"
)

// TestKubeadmImages writes kubeadm's images from the built tools, reads
// each archive back under its upstream name and unpacks its layer, then
// takes every container kubeadm's own `init --dry-run` creates and runs
// in it what the container runtime would: the program must be in the
// image (through its PATH), static or with its loader and libraries, and
// answer --version with the version its tag names. kube-proxy's iptables
// must load kube-proxy's rules, and CoreDNS must serve with kubeadm's
// Corefile.
func TestKubeadmImages(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: chroot into the image layers")
	}
	tools, err := controlplane.FindTools()
	if err != nil {
		t.Skipf("%v", err)
	}
	kubeadm := filepath.Join(tools, "kubeadm")
	if !exists(kubeadm) {
		t.Skipf("%s missing: run LABCLOUD_KUBEADM=true hack/build-tools.sh", kubeadm)
	}
	dir := t.TempDir()
	start := time.Now()
	files, err := WriteImages(dir, DiskOptions{Tools: tools}, KubeadmImages()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %d archives in %v", len(files), time.Since(start).Round(time.Millisecond))
	roots := map[string]string{}
	for i, ref := range KubeadmImages() {
		roots[ref] = readBackImage(t, ref, files[i])
	}

	dry := kubeadmDryRun(t, kubeadm)
	t.Run("kubeadm's images", func(t *testing.T) {
		if want := KubeadmImages(); !reflect.DeepEqual(dry.listed, want) {
			t.Errorf("kubeadm config images list: %q, want %q", dry.listed, want)
		}
		var run []string
		for _, c := range dry.containers {
			run = append(run, c.Image)
		}
		slices.Sort(run)
		want := slices.DeleteFunc(KubeadmImages(), func(ref string) bool { return ref == PauseImage })
		slices.Sort(want)
		if !reflect.DeepEqual(run, want) {
			t.Errorf("kubeadm init's containers run %q, want %q", run, want)
		}
	})

	// The sandbox containerd starts for every pod, then kubeadm's.
	containers := append([]kubeContainer{{Name: "sandbox", Image: PauseImage}}, dry.containers...)
	versions := map[string]struct{ flag, text string }{
		KubeAPIServerImage:         {"--version", "Kubernetes " + imageTag(t, KubeAPIServerImage)},
		KubeControllerManagerImage: {"--version", "Kubernetes " + imageTag(t, KubeControllerManagerImage)},
		KubeSchedulerImage:         {"--version", "Kubernetes " + imageTag(t, KubeSchedulerImage)},
		KubeProxyImage:             {"--version", "Kubernetes " + imageTag(t, KubeProxyImage)},
		// Upstream's tag has an image revision, -0.
		EtcdImage: {"--version", "etcd Version: " + strings.Split(imageTag(t, EtcdImage), "-")[0]},
		// hack/dnstools' CoreDNS, not the tag's: kubeadm's Corefile runs on both.
		CoreDNSImage: {"-version", "CoreDNS-" + strings.TrimPrefix(dnstoolsCoreDNS(t), "v")},
		PauseImage:   {"-v", "pause.c " + imageTag(t, PauseImage)},
	}
	for _, c := range containers {
		t.Run(c.Name, func(t *testing.T) {
			root, ok := roots[c.Image]
			if !ok {
				t.Fatalf("runs %s, which WriteImages does not write", c.Image)
			}
			im, _ := knownImage(c.Image)
			argv := runtimeArgv(c, im.cfg)
			if len(argv) == 0 {
				t.Fatalf("%s runs nothing: no command and no entrypoint", c.Image)
			}
			prog, err := lookPathIn(root, im.cfg.Env, argv[0])
			if err != nil {
				t.Fatal(err)
			}
			if err := loadable(root, prog); err != nil {
				t.Fatal(err)
			}
			v := versions[c.Image]
			out, err := inImage(root, prog, v.flag).CombinedOutput()
			if err != nil || !strings.Contains(string(out), v.text) {
				t.Errorf("%s %s in %s: %v, %q; want %q", prog, v.flag, c.Image, err, out, v.text)
			}
		})
	}

	t.Run("kube-proxy's iptables", func(t *testing.T) {
		testKubeProxyIPTables(t, roots[KubeProxyImage], imageByRef(t, KubeProxyImage).cfg.Env)
	})
	t.Run("kubeadm's Corefile", func(t *testing.T) {
		testKubeadmCorefile(t, roots[CoreDNSImage], dry.corefile)
	})
}

// readBackImage reads the archive at file as ref, checks its config is the
// recipe's and unpacks its one layer, with /proc and /dev to mount, in a
// directory it returns.
func readBackImage(t *testing.T, ref, file string) string {
	t.Helper()
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %s, %d bytes", ref, filepath.Base(file), fi.Size())
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(file, &tag)
	if err != nil {
		t.Fatalf("%s as %s: %v", file, ref, err)
	}
	cf, err := img.ConfigFile()
	if im, _ := knownImage(ref); err != nil || !reflect.DeepEqual(cf.Config, im.cfg) {
		t.Errorf("%s: config %+v, %v; want %+v", ref, cf.Config, err, im.cfg)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%s: %d layers, %v; want 1", ref, len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return unpackLayer(t, b)
}

func imageTag(t *testing.T, ref string) string {
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	return tag.TagStr()
}

// dnstoolsCoreDNS is the CoreDNS version hack/dnstools builds.
func dnstoolsCoreDNS(t *testing.T) string {
	b, err := os.ReadFile("../../hack/dnstools/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^require github.com/coredns/coredns (v\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("hack/dnstools/go.mod requires no github.com/coredns/coredns")
	}
	return string(m[1])
}

// kubeContainer is a container of a Pod kubeadm creates.
type kubeContainer struct {
	Name    string   `json:"name"`
	Image   string   `json:"image"`
	Command []string `json:"command"`
	Args    []string `json:"args"`
}

// runtimeArgv is what the container runtime runs for c in an image with
// cfg: the container's command, else the image's entrypoint, then the
// container's args, else (with no command) the image's cmd.
func runtimeArgv(c kubeContainer, cfg v1.Config) []string {
	cmd, args := c.Command, c.Args
	if len(cmd) == 0 {
		cmd = cfg.Entrypoint
		if len(args) == 0 {
			args = cfg.Cmd
		}
	}
	return append(slices.Clone(cmd), args...)
}

type kubeadmDry struct {
	listed     []string        // kubeadm config images list
	containers []kubeContainer // of the Pods kubeadm init creates
	corefile   string          // its coredns ConfigMap's
}

// kubeadmDryRun runs `kubeadm init --dry-run` and `kubeadm config images
// list`, chrooted in an empty directory with no network, at kubeadm's own
// version, and gathers the containers of the static Pods it would write
// and the objects it would create.
func kubeadmDryRun(t *testing.T, kubeadm string) kubeadmDry {
	t.Helper()
	root := t.TempDir()
	if err := copyFile(kubeadm, filepath.Join(root, "kubeadm")); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) []byte {
		cmd := exec.Command("unshare", append([]string{"--net", "chroot", root, "/kubeadm"}, args...)...)
		cmd.Env = append(slices.Clone(pathEnv), "KUBEADM_INIT_DRYRUN_DIR=/dry")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("kubeadm %s: %v: %s", strings.Join(args, " "), err, stderr.String())
		}
		return out
	}
	version := strings.TrimSpace(string(run("version", "-o", "short")))
	// A documentation address (RFC 5737): the namespace has no interface.
	config := fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: 192.0.2.10
nodeRegistration:
  name: node1
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: %s
`, version)
	if err := os.WriteFile(filepath.Join(root, "config.yaml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	var dry kubeadmDry
	dry.listed = strings.Fields(string(run("config", "images", "list", "--config", "/config.yaml")))
	out := run("init", "--dry-run", "--skip-phases=preflight", "--config", "/config.yaml")
	for _, doc := range dryRunObjects(out) {
		var obj struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				Containers []kubeContainer `json:"containers"`
				Template   struct {
					Spec struct {
						Containers []kubeContainer `json:"containers"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
			Data map[string]string `json:"data"`
		}
		if yaml.Unmarshal(doc, &obj) != nil {
			continue // kubeadm-flags.env, ...
		}
		dry.containers = append(dry.containers, obj.Spec.Containers...)
		dry.containers = append(dry.containers, obj.Spec.Template.Spec.Containers...)
		if obj.Kind == "ConfigMap" && obj.Metadata.Name == "coredns" {
			dry.corefile = obj.Data["Corefile"]
		}
	}
	if dry.corefile == "" {
		t.Fatalf("kubeadm init --dry-run creates no coredns ConfigMap:\n%s", out)
	}
	return dry
}

// dryRunObjects are the files and objects kubeadm init --dry-run prints,
// each after a line "[dryrun] Would write file ... with content:" or
// "[dryrun] Attached object:", up to the next line of kubeadm's ("[...").
func dryRunObjects(out []byte) [][]byte {
	var docs [][]byte
	var doc *bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "[") {
			if doc != nil {
				docs = append(docs, doc.Bytes())
				doc = nil
			}
			if line == "[dryrun] Attached object:" ||
				strings.HasPrefix(line, "[dryrun] Would write file") && strings.HasSuffix(line, "with content:") {
				doc = &bytes.Buffer{}
			}
			continue
		}
		if doc != nil {
			doc.WriteString(line + "\n")
		}
	}
	if doc != nil {
		docs = append(docs, doc.Bytes())
	}
	return docs
}

// lookPathIn finds prog in root as a runtime does: a path as it is, a name
// in the directories of env's PATH. It returns the path in the image.
func lookPathIn(root string, env []string, prog string) (string, error) {
	dirs := []string{""}
	if !strings.Contains(prog, "/") {
		dirs = nil
		for _, e := range env {
			if p, ok := strings.CutPrefix(e, "PATH="); ok {
				dirs = strings.Split(p, ":")
			}
		}
	}
	for _, d := range dirs {
		p := path.Join("/", d, prog)
		fi, err := os.Stat(filepath.Join(root, resolveIn(root, p)))
		if err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("no executable %s in the image (PATH %v)", prog, dirs)
}

// loaderDirs are where Debian's glibc loader looks for libraries with no
// ld.so.cache, as in these images.
var loaderDirs = []string{"lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib", "usr/lib"}

// amd64Loader is the x86-64 ABI's loader, which libc needs by its name.
const amd64Loader = "/lib64/ld-linux-x86-64.so.2"

// loadable fails unless the ELF file at p in root is static, or its
// loader and every library it needs, and theirs, are in root where the
// loader finds them.
func loadable(root, p string) error {
	return loadableSeen(root, p, map[string]bool{})
}

func loadableSeen(root, p string, seen map[string]bool) error {
	if seen[p] {
		return nil
	}
	seen[p] = true
	f, err := elf.Open(filepath.Join(root, resolveIn(root, p)))
	if err != nil {
		return err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(prog.Open())
		if err != nil {
			return err
		}
		interp := string(bytes.TrimRight(b, "\x00"))
		if _, err := os.Stat(filepath.Join(root, resolveIn(root, interp))); err != nil {
			return fmt.Errorf("%s: loader %s: %w", p, interp, err)
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return err
	}
	for _, lib := range libs {
		dirs := loaderDirs
		if lib == path.Base(amd64Loader) {
			dirs = []string{path.Dir(amd64Loader)}
		}
		found := ""
		for _, d := range dirs {
			if exists(filepath.Join(root, resolveIn(root, path.Join(d, lib)))) {
				found = path.Join(d, lib)
				break
			}
		}
		if found == "" {
			return fmt.Errorf("%s: library %s is not in %v", p, lib, dirs)
		}
		if err := loadableSeen(root, found, seen); err != nil {
			return err
		}
	}
	return nil
}

// testKubeProxyIPTables checks the commands kube-proxy runs in its image:
// each is there and loadable and is the host's iptables on the backend its
// name says, every extension loads, and iptables-restore, run as
// kube-proxy runs it in a network namespace of its own, loads rules like
// kube-proxy's: iptables-save then prints what the host's iptables prints
// for them.
func testKubeProxyIPTables(t *testing.T, root string, env []string) {
	for p, multi := range xtablesLinks() {
		prog, err := lookPathIn(root, env, path.Base(p))
		if err != nil {
			t.Error(err)
			continue
		}
		if err := loadable(root, prog); err != nil {
			t.Error(err)
		}
		got, err := inImage(root, prog, "--version").CombinedOutput()
		want, werr := exec.Command(filepath.Join("/usr/sbin", multi), path.Base(p), "--version").CombinedOutput()
		if err != nil || werr != nil || string(got) != string(want) {
			t.Errorf("%s --version in the image: %v, %q; the host's %s: %v, %q", prog, err, got, multi, werr, want)
		}
	}
	plugins, _ := filepath.Glob(filepath.Join(root, xtablesDir, "*.so"))
	if len(plugins) == 0 {
		t.Errorf("no iptables extensions in %s", xtablesDir)
	}
	for _, p := range plugins {
		if err := loadable(root, strings.TrimPrefix(p, root)); err != nil {
			t.Error(err)
		}
	}

	for _, family := range []struct{ cmd, rules string }{{"iptables", kubeProxyRules4}, {"ip6tables", kubeProxyRules6}} {
		rules := filepath.Join(t.TempDir(), "rules")
		if err := os.WriteFile(rules, []byte(family.rules), 0o644); err != nil {
			t.Fatal(err)
		}
		// kube-proxy's flags (pkg/util/iptables). The image has no shell:
		// the host's runs the image's programs, chrooted.
		restore := `%[1]s %[2]s-restore -w 5 -W 100000 --noflush --counters < "%[3]s" && %[1]s %[2]s-save`
		cmd := exec.Command("unshare", "--net", "--mount", "--propagation", "private", "sh", "-c",
			`mount -t proc proc "$0/proc" && mount --bind /dev "$0/dev" && `+fmt.Sprintf(restore, `chroot "$0"`, family.cmd, rules), root)
		cmd.Env = env
		got, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("%s-restore in the image: %v: %s", family.cmd, err, got)
			continue
		}
		want, err := exec.Command("unshare", "--net", "sh", "-c", fmt.Sprintf(restore, "", family.cmd, rules)).CombinedOutput()
		if err != nil {
			t.Fatalf("the host's %s-restore: %v: %s", family.cmd, err, want)
		}
		if g, w := withoutComments(got), withoutComments(want); g != w || !strings.Contains(g, "-j KUBE-SEP-A") {
			t.Errorf("%s-save in the image after kube-proxy's rules:\n%s\nthe host's:\n%s", family.cmd, g, w)
		}
	}
}

// withoutComments drops iptables-save's "# Generated by ..." lines.
func withoutComments(save []byte) string {
	var b strings.Builder
	for _, l := range strings.Split(string(save), "\n") {
		if !strings.HasPrefix(l, "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// kubeProxyRules4 are rules as kube-proxy's iptables proxier writes them
// (pkg/proxy/iptables), with every match and target it uses but nfacct,
// whose counters it makes first: a Service with two endpoints, session
// affinity, masquerading, a Service with none, the node ports' jump.
const kubeProxyRules4 = `*filter
:KUBE-FORWARD - [0:0]
:KUBE-SERVICES - [0:0]
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-SERVICES -d 10.96.0.11/32 -p tcp -m comment --comment "default/none:http has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
COMMIT
*nat
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-A - [0:0]
:KUBE-SEP-B - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-X - [0:0]
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-X
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-X -m comment --comment "kube-system/kube-dns:dns -> 10.244.0.2:53" -m recent --name KUBE-SEP-A --rcheck --seconds 10800 --reap -j KUBE-SEP-A
-A KUBE-SVC-X -m comment --comment "kube-system/kube-dns:dns -> 10.244.0.2:53" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-A
-A KUBE-SVC-X -j KUBE-SEP-B
-A KUBE-SEP-A -s 10.244.0.2/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-A -p udp -m recent --set --name KUBE-SEP-A --mask 255.255.255.255 --rsource -m udp -j DNAT --to-destination 10.244.0.2:53
-A KUBE-SEP-B -p udp -m udp -j DNAT --to-destination 10.244.1.2:53
COMMIT
`

// kubeProxyRules6 are the IPv6 proxier's, for a Service with one endpoint.
const kubeProxyRules6 = `*nat
:KUBE-MARK-MASQ - [0:0]
:KUBE-SEP-A - [0:0]
:KUBE-SERVICES - [0:0]
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-SERVICES -d fd00:10:96::a/128 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SEP-A
-A KUBE-SEP-A -s fd00:10:244::2/128 -j KUBE-MARK-MASQ
-A KUBE-SEP-A -p udp -m udp -j DNAT --to-destination [fd00:10:244::2]:53
COMMIT
`

// testKubeadmCorefile runs CoreDNS in its image as kubeadm's Deployment
// does, on kubeadm's Corefile, with a service account as the kubelet
// mounts it and an API server that never answers (the kubernetes plugin
// waits for it, then serves): every plugin the Corefile names must be in
// the build, its health answers OK and its readiness names kubernetes.
func testKubeadmCorefile(t *testing.T, root, corefile string) {
	sa := "var/run/secrets/kubernetes.io/serviceaccount"
	files := map[string]string{
		"etc/coredns/Corefile": corefile,
		sa + "/token":          "not-a-token",
		// The forward plugin's upstream: nothing listens there.
		"etc/resolv.conf": "nameserver 127.0.0.53\n",
	}
	for p, content := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	im := imageByRef(t, CoreDNSImage)
	env := append(slices.Clone(im.cfg.Env), "KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT=1")
	p := startInImage(t, root, env, runtimeArgv(kubeContainer{Args: []string{"-conf", "/etc/coredns/Corefile"}}, im.cfg)...)
	defer p.stop()

	banner := "CoreDNS-" + strings.TrimPrefix(dnstoolsCoreDNS(t), "v")
	for start := time.Now(); !strings.Contains(p.out.String(), banner); {
		if p.exited(100*time.Millisecond) || time.Since(start) > 30*time.Second {
			t.Fatalf("CoreDNS does not serve kubeadm's Corefile (hack/build-tools.sh rebuilds it from hack/dnstools): %s\nCorefile:\n%s", p.out.String(), corefile)
		}
	}
	health, err := p.inNetns("curl -s --max-time 2 http://127.0.0.1:8080/health")
	if err != nil || string(health) != "OK" {
		t.Errorf("GET :8080/health: %v, %q; want OK", err, health)
	}
	ready, err := p.inNetns("curl -s --max-time 2 -w ' %{http_code}' http://127.0.0.1:8181/ready")
	if err != nil || !strings.Contains(string(ready), "kubernetes") || !strings.HasSuffix(string(ready), " 503") {
		t.Errorf("GET :8181/ready with no API server: %v, %q; want 503 naming kubernetes", err, ready)
	}
}
