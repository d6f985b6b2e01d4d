package up

import (
	"maps"
	"net/netip"
	"os"
	"path"
	"slices"
	"strings"
	"testing"

	proxyv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/labcloud/labcloud/lab"
)

// The node's files for each family: the family for lab-init, kube-dns's
// addresses for the kubelet, the pod ranges for kube-proxy.
func TestNodeFilesPerFamily(t *testing.T) {
	for _, f := range lab.IPFamilies {
		t.Run(string(f), func(t *testing.T) {
			files, err := nodeFiles(nodeIdentity{Name: "lab-node-1", APIServer: defaultsOf(f).APIServerURL(), CAPEM: []byte("ca"),
				KubeletToken: "k", ProxyToken: "p", Addressing: defaultsOf(f)})
			if err != nil {
				t.Fatal(err)
			}
			byPath := map[string][]byte{}
			for _, nf := range files {
				byPath[nf.Path] = nf.Data
			}
			if got := string(byPath[ipFamilyPath]); got != string(f)+"\n" {
				t.Errorf("%s = %q", ipFamilyPath, got)
			}
			var kc kubeletv1beta1.KubeletConfiguration
			if err := yaml.Unmarshal(byPath[kubeletConfigPath], &kc); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(kc.ClusterDNS, defaultsOf(f).ClusterDNS()) {
				t.Errorf("kubelet clusterDNS %v, want %v", kc.ClusterDNS, defaultsOf(f).ClusterDNS())
			}
			var pc proxyv1alpha1.KubeProxyConfiguration
			if err := yaml.Unmarshal(byPath[proxyConfigPath], &pc); err != nil {
				t.Fatal(err)
			}
			if want := strings.Join(defaultsOf(f).ClusterCIDRs(), ","); pc.ClusterCIDR != want {
				t.Errorf("kube-proxy clusterCIDR %q, want %q", pc.ClusterCIDR, want)
			}
			if !strings.Contains(string(byPath[kubeletKubeconfig]), defaultsOf(f).APIServerURL()) {
				t.Errorf("kubelet kubeconfig does not name %s", defaultsOf(f).APIServerURL())
			}
		})
	}
}

// Every node's containerd reads the lab registry's hosts file, naming the
// registry at the bridge's address of the lab's primary family.
func TestNodesPullFromTheLabRegistry(t *testing.T) {
	cfg, err := os.ReadFile("../image/noderoot/etc/containerd/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	dir := path.Dir(path.Dir(registryHostsPath)) // .../certs.d of .../certs.d/_default/hosts.toml
	if !strings.Contains(string(cfg), "[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = '"+dir+"'") {
		t.Errorf("the nodes' containerd does not read hosts files from %s:\n%s", dir, cfg)
	}
	for f, want := range map[lab.IPFamily]string{lab.IPv4: "http://10.123.0.1:5000", lab.IPv6: "http://[fd00:10:123::1]:5000", lab.DualStack: "http://10.123.0.1:5000"} {
		files, err := nodeFiles(nodeIdentity{Name: "lab-node-1", APIServer: defaultsOf(f).APIServerURL(), CAPEM: []byte("ca"), Addressing: defaultsOf(f)})
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
		if gw := netip.MustParseAddrPort(defaultsOf(f).RegistryAddr()).Addr().String(); !strings.Contains(strings.Join(defaultsOf(f).Gateways(), " "), gw) {
			t.Errorf("%s: nodes look for the registry at %s, not a gateway address %v", f, gw, defaultsOf(f).Gateways())
		}
	}
}

// An insecure registry (up --insecure-registry) gets a hosts file of its
// own in every node: the lab's registry first, then itself over HTTP.
func TestNodesPullInsecureRegistriesOverHTTP(t *testing.T) {
	a := defaultsOf(lab.IPv4)
	files, err := nodeFiles(nodeIdentity{Name: "lab-node-1", APIServer: a.APIServerURL(), CAPEM: []byte("ca"), Addressing: a,
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
