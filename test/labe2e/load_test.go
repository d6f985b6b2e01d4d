package labe2e

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// checkLoad loads an image built here (busybox's httpd serving a random
// token, under a name no registry has) with `labcloud load archive`, runs it
// on every node with imagePullPolicy Always and IfNotPresent, restarts one
// node and runs it there again: the node, its disk a fresh tmpfs, pulls
// from the lab's registry as before. Call it from a lab test with the lab
// up (TestLab: checkLoad(t, l)); it needs /bin/busybox static on the host.
func checkLoad(t *testing.T, l *labcloud) {
	t.Helper()
	token := randomHex(t)
	ref := "example.invalid/e2e/app:" + token[:12]
	archive := busyboxArchive(t, ref, token)

	out := l.must(10*time.Minute, "load", "archive", archive)
	if !strings.Contains(out, ref+": loaded (sha256:") {
		t.Fatalf("labcloud load archive printed no loaded line for %s:\n%s", ref, out)
	}
	if out = l.must(10*time.Minute, "load", "archive", archive); !strings.Contains(out, "already loaded") {
		t.Errorf("loading again did not say already loaded:\n%s", out)
	}

	nodes := l.status().Nodes
	// runOn starts a pod of the image on each node with each policy, all
	// at once, and waits until every one answers with the token.
	runOn := func(nodes []string, policies ...string) {
		var pods []string
		for _, node := range nodes {
			for _, policy := range policies {
				pod := fmt.Sprintf("load-%s-%s", strings.ToLower(policy), node)
				_, _ = l.kubectl(time.Minute, "delete", "pod", pod, "--ignore-not-found", "--wait")
				l.apply(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, labels: {app: load}}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: %s
    imagePullPolicy: %s
    ports: [{containerPort: 8080}]
    readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
`, pod, node, ref, policy))
				pods = append(pods, pod)
			}
		}
		for _, pod := range pods {
			l.mustKubectl("wait", "--for=condition=Ready", "pod/"+pod, "--timeout=5m")
			ip := l.mustKubectl("get", "pod", pod, "-o", "jsonpath={.status.podIP}")
			eventually(t, pod+" answers with the loaded image's token", time.Minute, time.Second, func() string {
				got, err := l.curl("http://" + hostPort(ip, "8080") + "/")
				if err != nil || got != token {
					return fmt.Sprintf("got %q %v, want %q", got, err, token)
				}
				return ""
			})
		}
	}
	var names []string
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	runOn(names, "Always", "IfNotPresent")

	// A node restarted later (its root a fresh tmpfs, no image) pulls the
	// loaded image again from the lab's registry.
	node := names[len(names)-1]
	bootID := l.mustKubectl("get", "node", node, "-o", "jsonpath={.status.nodeInfo.bootID}")
	l.must(5*time.Minute, "node", "stop", node)
	l.must(5*time.Minute, "node", "start", node)
	eventually(t, node+" back with a new boot", 10*time.Minute, 2*time.Second, func() string {
		out, err := l.kubectl(time.Minute, "get", "node", node, "-o", `jsonpath={.status.nodeInfo.bootID} {.status.conditions[?(@.type=="Ready")].status}`)
		if f := strings.Fields(out); err != nil || len(f) != 2 || f[0] == bootID || f[1] != "True" {
			return fmt.Sprintf("boot ID and Ready %q %v (boot ID before %s)", out, err, bootID)
		}
		return ""
	})
	runOn([]string{node}, "IfNotPresent", "Always")
	l.mustKubectl("delete", "pod", "-l", "app=load", "--wait=false")
}

func hostPort(ip, port string) string {
	if strings.Contains(ip, ":") {
		return "[" + ip + "]:" + port
	}
	return ip + ":" + port
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// busyboxArchive writes a docker-archive of one image named ref,
// busyboxImage's.
func busyboxArchive(t *testing.T, ref, token string) string {
	t.Helper()
	img := busyboxImage(t, token)
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "app.tar")
	if err := tarball.WriteToFile(p, tag, img); err != nil {
		t.Fatal(err)
	}
	return p
}

// busyboxImage is the host's static busybox running httpd on port 8080,
// serving token.
func busyboxImage(t *testing.T, token string) v1.Image {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("no /bin/busybox to build the image from: %v", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"bin/", "www/"} {
		if err := tw.WriteHeader(&tar.Header{Name: d, Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []struct {
		name string
		mode int64
		data []byte
	}{{"bin/busybox", 0o755, bb}, {"www/index.html", 0o644, []byte(token)}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write(f.data)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	cfg.Config = v1.Config{Entrypoint: []string{"/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/www"}}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		t.Fatal(err)
	}
	return img
}
