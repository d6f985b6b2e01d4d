package image

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/net/dns/dnsmessage"
)

// TestImagesUnderUpstreamNames writes the node disk's image archives and
// reads each back under its upstream reference: its config, the programs
// the e2e tests run in it (executable), and the layer glibc-dns-testing
// shares with agnhost.
func TestImagesUnderUpstreamNames(t *testing.T) {
	dir := t.TempDir()
	if _, err := WriteImages(dir, DiskOptions{Tools: fakeTools(t)}, nodeImageRefs()...); err != nil {
		t.Fatal(err)
	}
	dnsProbe := []string{"bin/sh", "usr/bin/dig", "usr/bin/getent", "usr/bin/seq", "bin/sleep"}
	want := map[string][]string{
		PauseImage:           {"pause"},
		AgnhostImage:         append([]string{"agnhost", "usr/bin/curl", "usr/bin/wget", "usr/bin/nc", "bin/busybox"}, dnsProbe...),
		GlibcDNSTestingImage: dnsProbe,
		NginxImage:           {"usr/sbin/nginx"},
	}
	digests := map[string]v1.Hash{}
	for _, im := range containerImages {
		tag, err := name.NewTag(im.ref)
		if err != nil {
			t.Fatal(err)
		}
		img, err := tarball.ImageFromPath(filepath.Join(dir, im.file), &tag)
		if err != nil {
			t.Errorf("%s: %v", im.file, err)
			continue
		}
		cf, err := img.ConfigFile()
		if err != nil || !reflect.DeepEqual(cf.Config, im.cfg) {
			t.Errorf("%s: config %+v, %v; want %+v", im.ref, cf.Config, err, im.cfg)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 1 {
			t.Fatalf("%s: %d layers, %v; want 1", im.ref, len(layers), err)
		}
		if digests[im.ref], err = layers[0].Digest(); err != nil {
			t.Fatal(err)
		}
		rc, err := layers[0].Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		if err != nil {
			t.Fatal(err)
		}
		root := t.TempDir()
		if err := untar(b, root); err != nil {
			t.Fatal(err)
		}
		for _, p := range want[im.ref] {
			// Symlinks resolve inside the image (busybox's applets, /bin/sh).
			fi, err := os.Stat(filepath.Join(root, resolveIn(root, p)))
			if err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
				t.Errorf("%s: /%s is not an executable program: %v", im.ref, p, err)
			}
		}
		if im.ref == AgnhostImage {
			// porter serves TLS with the pair in its working directory, /.
			for _, f := range []string{"localhost.crt", "localhost.key"} {
				if b, err := os.ReadFile(filepath.Join(root, f)); err != nil || string(b) != "fake "+f {
					t.Errorf("%s: /%s is not porter's: %q, %v", im.ref, f, b, err)
				}
			}
		}
	}
	if digests[GlibcDNSTestingImage] != digests[AgnhostImage] {
		t.Errorf("glibc-dns-testing's layer %s is not agnhost's %s: nodes would hold dig twice", digests[GlibcDNSTestingImage], digests[AgnhostImage])
	}
}

// resolveIn follows p's symlinks (absolute ones from root) inside root.
func resolveIn(root, p string) string {
	for range 10 {
		target, err := os.Readlink(filepath.Join(root, p))
		if err != nil {
			return p
		}
		if filepath.IsAbs(target) {
			p = target
		} else {
			p = filepath.Join(filepath.Dir(p), target)
		}
	}
	return p
}

// TestAgnhostShellRunsUpstreamProbes runs what upstream e2e tests exec in
// the agnhost image, `/bin/sh -c 'wget ...'` and `nc -v -t`, inside the layer we build (as a
// chroot) against an HTTP server on loopback. Debian's static busybox sh
// runs its own wget applet before PATH, and that applet crashes: the
// image's shell must be one that finds GNU wget.
func TestAgnhostShellRunsUpstreamProbes(t *testing.T) {
	root := unpackedImage(t, AgnhostImage)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "hello from loopback")
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	sh := func(command string) (string, error) {
		out, err := inImage(root, "/bin/sh", "-c", command).CombinedOutput()
		return string(out), err
	}
	if out, err := sh(fmt.Sprintf(`wget -T 5 -qO- "%s"`, ln.Addr())); err != nil || out != "hello from loopback" {
		t.Errorf("sh -c wget in the agnhost layer: %v, output %q", err, out)
	}
	// A probe that must fail (a source range that drops it) is tried once,
	// as busybox's wget in upstream's image does: GNU wget would retry a
	// timed-out read 20 times, outlasting the e2e test's poll.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	accepted := make(chan net.Conn, 32)
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			accepted <- c // held open, never answered
		}
	}()
	if out, err := sh(fmt.Sprintf(`wget -T 1 -qO- "%s"`, silent.Addr())); err == nil {
		t.Errorf("wget from a server that never answers succeeded: %q", out)
	}
	if n := len(accepted); n != 1 {
		t.Errorf("wget connected %d times to a server that never answers, want 1 (no retries)", n)
	}
	// CheckServiceReachability's probe: upstream's agnhost carries
	// netcat-openbsd, whose -v and -t busybox's small nc refuses.
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	if out, err := sh(fmt.Sprintf(`echo hostName | nc -v -t -w 2 %s %s`, host, port)); err != nil {
		t.Errorf("sh -c 'nc -v -t' in the agnhost layer: %v, output %q", err, out)
	}
}

// TestDNSProbesRunInImages runs the DNS tests' probe scripts, as
// test/e2e/network/dns_common.go writes them, in both probers' images
// against a DNS server on loopback, with the resolv.conf and /etc/hosts a
// kubelet writes: dig over UDP and TCP through the search path, dig +short
// for an ExternalName's CNAME, getent for the pod's own names. The changes:
// dig asks the server's port (-p), not 53, and `$` stands for the `$$` the
// kubelet turns into one.
func TestDNSProbesRunInImages(t *testing.T) {
	server := dnsServer(t, map[string]dnsRecord{
		"kubernetes.default.svc.cluster.local.":    {dnsmessage.TypeA, &dnsmessage.AResource{A: [4]byte{10, 96, 0, 1}}},
		"dns-test-service-3.ns.svc.cluster.local.": {dnsmessage.TypeCNAME, &dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName("foo.example.com.")}},
	})
	dig := "dig -p " + server
	var probe strings.Builder
	probe.WriteString("for i in `seq 1 1`; do ")
	for _, n := range []string{"kubernetes.default", "no-such-service.default"} {
		for _, proto := range []string{"notcp", "tcp"} {
			fmt.Fprintf(&probe, `check="$(%s +%s +noall +answer +search %s A)" && test -n "$check" && echo OK > /results/%s@%s;`, dig, proto, n, proto, n)
		}
	}
	for _, n := range []string{"dns-querier-1.dns-test-service.ns.svc.cluster.local", "dns-querier-1", "no-such-host"} {
		fmt.Fprintf(&probe, `test -n "$(getent hosts %s)" && echo OK > /results/hosts@%s;`, n, n)
	}
	probe.WriteString("sleep 1; done; ")
	fmt.Fprintf(&probe, "%s +short dns-test-service-3.ns.svc.cluster.local CNAME > /results/cname", dig)
	want := map[string]string{
		"notcp@kubernetes.default": "OK\n", "tcp@kubernetes.default": "OK\n",
		"hosts@dns-querier-1.dns-test-service.ns.svc.cluster.local": "OK\n", "hosts@dns-querier-1": "OK\n",
		"cname": "foo.example.com.\n",
	}

	for _, ref := range []string{AgnhostImage, GlibcDNSTestingImage} {
		root := unpackedImage(t, ref)
		kubelet := map[string]string{
			"etc/resolv.conf": "search ns.svc.cluster.local svc.cluster.local cluster.local\nnameserver 127.0.0.1\noptions ndots:5\n",
			"etc/hosts":       "127.0.0.1\tlocalhost\n10.244.1.5\tdns-querier-1.dns-test-service.ns.svc.cluster.local\tdns-querier-1\n",
		}
		for p, content := range kubelet {
			if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Mkdir(filepath.Join(root, "results"), 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := inImage(root, "sh", "-c", probe.String()).CombinedOutput(); err != nil {
			t.Errorf("%s: probe: %v: %s", ref, err, out)
		}
		got := map[string]string{}
		entries, _ := os.ReadDir(filepath.Join(root, "results"))
		for _, e := range entries {
			b, _ := os.ReadFile(filepath.Join(root, "results", e.Name()))
			got[e.Name()] = string(b)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: probe results %q, want %q", ref, got, want)
		}
	}
}

// TestNginxServesOnPort80 runs the nginx image's command in its layer, in
// a network namespace of its own (port 80 there is free whatever the host
// runs), asks it for a page on port 80, and finds the request in its
// standard output, where kubectl logs reads.
func TestNginxServesOnPort80(t *testing.T) {
	root := unpackedImage(t, NginxImage)
	im := imageByRef(t, NginxImage)
	p := startInImage(t, root, im.cfg.Env, im.cfg.Cmd...)
	defer p.stop()

	var body string
	for start := time.Now(); body == "" && time.Since(start) < 10*time.Second; {
		if p.exited(100 * time.Millisecond) {
			t.Fatalf("nginx exited: %s", p.out.String())
		}
		resp, err := p.inNetns("curl -s -i --max-time 2 http://127.0.0.1:80/")
		head, content, ok := strings.Cut(string(resp), "\r\n\r\n")
		if err != nil || !ok {
			continue
		}
		status := strings.Fields(strings.SplitN(head, "\r\n", 2)[0])
		if len(status) < 2 {
			continue
		}
		body = strings.Join(status[1:], " ") + "\n" + content
	}
	p.stop()
	if !strings.HasPrefix(body, "200 OK\n") || !strings.Contains(body, "Welcome to nginx!") {
		t.Errorf("GET / from nginx: %q; its output: %s", body, p.out.String())
	}
	if !strings.Contains(p.out.String(), `"GET / HTTP/1.1" 200`) {
		t.Errorf("nginx's output lacks the request (access log to stdout): %s", p.out.String())
	}
}

// imageProcess is a program running chrooted in an unpacked image, in a
// network namespace of its own.
type imageProcess struct {
	cmd  *exec.Cmd
	out  *syncBuffer // its standard output and error
	done chan struct{}
}

// startInImage starts argv in root (inImage) with env, in a network
// namespace of its own; stop ends it.
func startInImage(t *testing.T, root string, env []string, argv ...string) *imageProcess {
	t.Helper()
	cmd := inImage(root, argv...)
	cmd.Args = slices.Insert(cmd.Args, 1, "--net")
	cmd.Env = env
	p := &imageProcess{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p
}

// exited waits up to d for the program to exit and says whether it has.
func (p *imageProcess) exited(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// stop ends the program with SIGTERM (its output is whole once it has),
// SIGKILL after 10 seconds.
func (p *imageProcess) stop() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	if !p.exited(10 * time.Second) {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// inNetns runs a host shell script in the program's network namespace
// (unshare's own, which its child shares), with the namespace's loopback
// up, and returns its standard output.
func (p *imageProcess) inNetns(script string) ([]byte, error) {
	return exec.Command("nsenter", fmt.Sprintf("--net=/proc/%d/ns/net", p.cmd.Process.Pid),
		"sh", "-c", "ip link set lo up && "+script).Output()
}

// syncBuffer is a bytes.Buffer a running program writes while the test
// reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type dnsRecord struct {
	typ  dnsmessage.Type
	body dnsmessage.ResourceBody
}

// dnsServer answers questions for records on a loopback port, over UDP and
// TCP, with NXDOMAIN for names it does not hold, and returns the port.
func dnsServer(t *testing.T, records map[string]dnsRecord) string {
	answer := func(query []byte) []byte {
		var p dnsmessage.Parser
		h, err := p.Start(query)
		if err != nil {
			return nil
		}
		q, err := p.Question()
		if err != nil {
			return nil
		}
		resp := dnsmessage.Message{
			Header:    dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true},
			Questions: []dnsmessage.Question{q},
		}
		r, ok := records[strings.ToLower(q.Name.String())]
		if !ok {
			resp.RCode = dnsmessage.RCodeNameError
		} else if r.typ == q.Type {
			resp.Answers = []dnsmessage.Resource{{Header: dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 30}, Body: r.body}}
		}
		b, _ := resp.Pack()
		return b
	}
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := strconv.Itoa(pc.LocalAddr().(*net.UDPAddr).Port)
		ln, err := net.Listen("tcp", "127.0.0.1:"+port)
		if err != nil {
			pc.Close()
			continue
		}
		t.Cleanup(func() { pc.Close(); ln.Close() })
		go func() {
			buf := make([]byte, 65535)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo(answer(buf[:n]), from)
			}
		}()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					for {
						var n uint16
						if binary.Read(c, binary.BigEndian, &n) != nil {
							return
						}
						query := make([]byte, n)
						if _, err := io.ReadFull(c, query); err != nil {
							return
						}
						resp := answer(query)
						_, _ = c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(resp))), resp...))
					}
				}()
			}
		}()
		return port
	}
	t.Fatal("no loopback port free for both UDP and TCP")
	return ""
}

// unpackedImage builds the layer of the image ref names (static busybox
// stands in for pause and agnhost) and unpacks it in a directory, with
// /proc and /dev to mount for inImage. It needs root.
func unpackedImage(t *testing.T, ref string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: chroot into the image layer")
	}
	layer, err := imageByRef(t, ref).layer.build(DiskOptions{Tools: fakeTools(t)})
	if err != nil {
		t.Fatal(err)
	}
	return unpackLayer(t, layer)
}

// unpackLayer unpacks a layer in a directory, with /proc and /dev to
// mount for inImage.
func unpackLayer(t *testing.T, layer []byte) string {
	t.Helper()
	root := t.TempDir()
	if err := untar(layer, root); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"proc", "dev"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// inImage runs argv chrooted in root as a container would run it: with
// /proc (busybox's shell execs its applets through /proc/self/exe) and
// /dev (/dev/stdout), mounted in a mount namespace of its own.
func inImage(root string, argv ...string) *exec.Cmd {
	script := `mount -t proc proc "$1/proc" && mount --bind /dev "$1/dev" && r=$1 && shift && exec chroot "$r" "$@"`
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "--fork", "sh", "-c", script, "sh", root}, argv...)...)
	cmd.Env = pathEnv
	return cmd
}

func imageByRef(t *testing.T, ref string) containerImage {
	im, ok := knownImage(ref)
	if !ok {
		t.Fatalf("no image %s", ref)
	}
	return im
}

// fakeTools is a tools directory where static busybox stands in for pause
// and agnhost, beside a stand-in for porter's TLS pair: only the images'
// other programs run.
func fakeTools(t *testing.T) string {
	tools := t.TempDir()
	for _, n := range []string{"pause", "agnhost"} {
		if err := copyFile(DefaultBusybox, filepath.Join(tools, n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(tools, "porter"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"localhost.crt", "localhost.key"} {
		if err := os.WriteFile(filepath.Join(tools, "porter", f), []byte("fake "+f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return tools
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}

// untar writes a layer's regular files, directories and symlinks under dir.
func untar(layer []byte, dir string) error {
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, strings.TrimSuffix(h.Name, "/"))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, os.FileMode(h.Mode).Perm())
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		case tar.TypeReg:
			var b []byte
			if b, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(p, b, os.FileMode(h.Mode).Perm())
			}
		}
		if err != nil {
			return err
		}
	}
}
