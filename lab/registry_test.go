package lab

import (
	"context"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/labcloud/labcloud/internal/nstest"
)

// Every node's containerd reads the lab registry's hosts file, naming the
// registry at the bridge's address of the lab's primary family.
func TestNodesPullFromTheLabRegistry(t *testing.T) {
	cfg, err := os.ReadFile("image/noderoot/etc/containerd/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	dir := path.Dir(path.Dir(registryHostsPath)) // .../certs.d of .../certs.d/_default/hosts.toml
	if !strings.Contains(string(cfg), "[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = '"+dir+"'") {
		t.Errorf("the nodes' containerd does not read hosts files from %s:\n%s", dir, cfg)
	}
	for f, want := range map[IPFamily]string{IPv4: "http://10.123.0.1:5000", IPv6: "http://[fd00:10:123::1]:5000", DualStack: "http://10.123.0.1:5000"} {
		files, err := nodeFiles(nodeIdentity{Name: "lab-node-1", APIServer: defaults.of(f).apiServerURL(), CAPEM: []byte("ca"), Addressing: defaults.of(f)})
		if err != nil {
			t.Fatal(err)
		}
		var hosts string
		for _, nf := range files {
			if nf.Path == registryHostsPath {
				hosts = string(nf.Data)
			}
		}
		if !strings.Contains(hosts, `[host."`+want+`"]`) {
			t.Errorf("%s: %s is %q, want the mirror %s", f, registryHostsPath, hosts, want)
		}
		// The registry listens where the nodes look.
		if gw := netip.MustParseAddrPort(defaults.of(f).registryAddr()).Addr().String(); !strings.Contains(strings.Join(defaults.of(f).gateways, " "), gw) {
			t.Errorf("%s: nodes look for the registry at %s, not a gateway address %v", f, gw, defaults.of(f).gateways)
		}
	}
}

// An insecure registry (up --insecure-registry) gets a hosts file of its
// own in every node: the lab's registry first, then itself over HTTP.
func TestNodesPullInsecureRegistriesOverHTTP(t *testing.T) {
	a := defaults.of(IPv4)
	files, err := nodeFiles(nodeIdentity{Name: "lab-node-1", APIServer: a.apiServerURL(), CAPEM: []byte("ca"), Addressing: a,
		Insecure: []string{"registry.test:5000"}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, nf := range files {
		got[nf.Path] = string(nf.Data)
	}
	hosts := got["/etc/containerd/certs.d/registry.test:5000/hosts.toml"]
	for _, want := range []string{`server = "http://registry.test:5000"`, `[host."http://10.123.0.1:5000"]`} {
		if !strings.Contains(hosts, want) {
			t.Errorf("the hosts file of registry.test:5000 lacks %s: %q (node files %v)", want, hosts, slices.Sorted(maps.Keys(got)))
		}
	}
	if got[registryHostsPath] == "" {
		t.Errorf("no %s beside it", registryHostsPath)
	}
}

// labcloud load dials the registry's loopback address inside the lab's
// namespace from the host's: the connection reaches a server there, which
// the host's own loopback does not have.
func TestDialInNetns(t *testing.T) {
	ns := nstest.Named(t, "lc-load")
	var l net.Listener
	nstest.InNamed(t, ns, func() {
		var err error
		if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	})
	defer l.Close()
	go func() {
		_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "in the lab") }))
	}()
	addr := l.Addr().String()

	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatalf("%s answers on the host's loopback too: the test proves nothing", addr)
	}
	client := &http.Client{Transport: &http.Transport{DialContext: dialInNetns(ns)}}
	for range 3 { // new connections each time, each dialled on a thread of its own
		client.CloseIdleConnections()
		resp, err := client.Get("http://" + addr)
		if err != nil {
			t.Fatalf("dial in %s: %v", ns, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "in the lab" {
			t.Fatalf("got %q", b)
		}
	}
	// This goroutine's namespace is still the host's.
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Error("after dialling in the lab's namespace, a plain dial reaches it too")
	}
	if _, err := dialInNetns("lc-load-absent")(context.Background(), "tcp", addr); err == nil || !strings.Contains(err.Error(), "lc-load-absent") {
		t.Errorf("a namespace that does not exist: %v", err)
	}
}
