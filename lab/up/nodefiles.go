package up

import (
	"fmt"
	"path"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	componentbaseconfigv1alpha1 "k8s.io/component-base/config/v1alpha1"
	proxyv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/labcloud/labcloud/lab"
	"github.com/labcloud/labcloud/lab/controlplane"
	"github.com/labcloud/labcloud/lab/image"
	"github.com/labcloud/labcloud/lab/registry"
)

// Paths of a node's own files, as a kubeadm node has them.
const (
	kubeletKubeconfig = "/etc/kubernetes/kubelet.conf"
	nodeCAPath        = "/etc/kubernetes/pki/ca.crt"
	kubeletConfigPath = "/var/lib/kubelet/config.yaml"
	proxyKubeconfig   = "/var/lib/kube-proxy/kubeconfig"
	proxyConfigPath   = "/var/lib/kube-proxy/config.yaml"
	// ipFamilyPath tells the node's init (lab/image's lab-init/rc) which
	// families to configure and pass to the kubelet as --node-ip.
	ipFamilyPath = "/etc/labcloud/ip-family"
	// registryHostsPath is containerd's hosts file for every registry name.
	registryHostsPath = "/etc/containerd/certs.d/_default/hosts.toml"
)

// nodeIdentity is what one node needs to join: its name, the API server, the
// CA, the kubelet's token (user system:node:<name>) and kube-proxy's
// (user system:kube-proxy, bound to system:node-proxier by default).
type nodeIdentity struct {
	Name, APIServer string
	CAPEM           []byte
	KubeletToken    string
	ProxyToken      string
	Addressing      lab.Addresses
	ProxyMode       string   // iptables or nftables
	Insecure        []string // registries pulled from over plain HTTP
}

// nodeFiles are a node's kubeconfigs, the kubelet's and kube-proxy's
// configuration files, and containerd's way to the lab's registry (its
// address depends on the family).
func nodeFiles(id nodeIdentity) ([]image.NodeFile, error) {
	kubelet, err := controlplane.Kubeconfig(id.APIServer, id.CAPEM, "system:node:"+id.Name, id.KubeletToken)
	if err != nil {
		return nil, err
	}
	proxy, err := controlplane.Kubeconfig(id.APIServer, id.CAPEM, "system:kube-proxy", id.ProxyToken)
	if err != nil {
		return nil, err
	}
	kc, err := kubeletConfig(id.Addressing)
	if err != nil {
		return nil, err
	}
	pc, err := proxyConfig(id)
	if err != nil {
		return nil, err
	}
	return append([]image.NodeFile{
		{Path: "/etc/hostname", Mode: 0o644, Data: []byte(id.Name + "\n")},
		{Path: nodeCAPath, Mode: 0o644, Data: id.CAPEM},
		{Path: kubeletKubeconfig, Mode: 0o600, Data: kubelet},
		{Path: kubeletConfigPath, Mode: 0o644, Data: kc},
		{Path: proxyKubeconfig, Mode: 0o600, Data: proxy},
		{Path: proxyConfigPath, Mode: 0o644, Data: pc},
		{Path: ipFamilyPath, Mode: 0o644, Data: []byte(string(id.Addressing.Family()) + "\n")},
	}, registryHosts(id.Addressing, id.Insecure)...), nil
}

// kubeletConfig is a kubeadm-like kubelet configuration for a small node
// that runs on a tmpfs root: webhook authentication and authorization (the
// API server's client certificate from the cluster CA for logs and exec),
// cgroupfs on cgroup v2, containerd's socket, and kind's settings that keep
// a small node from evicting or garbage-collecting what it just imported.
// Pods resolve through kube-dns's cluster IPs of the cluster's families.
func kubeletConfig(a lab.Addresses) ([]byte, error) {
	c := kubeletv1beta1.KubeletConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: "kubelet.config.k8s.io/v1beta1", Kind: "KubeletConfiguration"},
		Authentication: kubeletv1beta1.KubeletAuthentication{
			X509:      kubeletv1beta1.KubeletX509Authentication{ClientCAFile: nodeCAPath},
			Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: ptr.To(true)},
			Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: ptr.To(false)},
		},
		Authorization:               kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeWebhook},
		CgroupDriver:                "cgroupfs",
		ContainerRuntimeEndpoint:    "unix:///run/containerd/containerd.sock",
		FailSwapOn:                  ptr.To(false),
		ImageGCHighThresholdPercent: ptr.To[int32](100),
		EvictionHard: map[string]string{
			"nodefs.available": "0%", "nodefs.inodesFree": "0%", "imagefs.available": "0%",
		},
		ClusterDomain:             lab.ClusterDomain,
		ClusterDNS:                a.ClusterDNS(),
		ResolverConfig:            ptr.To("/etc/resolv.conf"),
		RotateCertificates:        false,
		ServerTLSBootstrap:        false,
		NodeStatusReportFrequency: metav1.Duration{Duration: time.Minute},
	}
	b, err := yaml.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("kubelet configuration: %w", err)
	}
	return b, nil
}

// proxyConfig runs kube-proxy in iptables (or nftables) mode with the
// cluster's pod ranges, so traffic from outside them is told apart. With
// both families' ranges it runs dual-stack: one proxier per family.
func proxyConfig(id nodeIdentity) ([]byte, error) {
	mode := id.ProxyMode
	if mode == "" {
		mode = "iptables"
	}
	c := proxyv1alpha1.KubeProxyConfiguration{
		TypeMeta:         metav1.TypeMeta{APIVersion: "kubeproxy.config.k8s.io/v1alpha1", Kind: "KubeProxyConfiguration"},
		ClientConnection: componentbaseconfigv1alpha1.ClientConnectionConfiguration{Kubeconfig: proxyKubeconfig},
		Mode:             proxyv1alpha1.ProxyMode(mode),
		ClusterCIDR:      strings.Join(id.Addressing.ClusterCIDRs(), ","),
		HostnameOverride: id.Name,
		Conntrack:        proxyv1alpha1.KubeProxyConntrackConfiguration{MaxPerCore: ptr.To[int32](0)},
	}
	b, err := yaml.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("kube-proxy configuration: %w", err)
	}
	return b, nil
}

// registryHosts are the node files that send every pull to the lab's
// registry first, and each of the insecure registries' to itself over
// plain HTTP after it.
func registryHosts(a lab.Addresses, insecure []string) []image.NodeFile {
	files := []image.NodeFile{{Path: registryHostsPath, Mode: 0o644, Data: registry.HostsTOML(a.RegistryAddr())}}
	for _, r := range insecure {
		files = append(files, image.NodeFile{Path: path.Join(path.Dir(path.Dir(registryHostsPath)), r, "hosts.toml"), Mode: 0o644, Data: registry.PlainHTTPHostsTOML(a.RegistryAddr(), r)})
	}
	return files
}
