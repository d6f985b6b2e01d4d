package image

import v1 "github.com/google/go-containerregistry/pkg/v1"

// KubeadmImages are the images `kubeadm init` and `kubeadm join` 1.36.3
// run, in the order `kubeadm config images list` names them. Preloaded
// into a guest's containerd (WriteImages writes them), nothing is pulled.
func KubeadmImages() []string {
	return []string{KubeAPIServerImage, KubeControllerManagerImage, KubeSchedulerImage,
		KubeProxyImage, CoreDNSImage, PauseImage, EtcdImage}
}

// kubeadmImages are kubeadm's images but pause (the node disk's serves).
//
// They hold what upstream's run: the program at upstream's path, PATH
// set, distroless' /etc files and /tmp. kubeadm's manifests name the
// program to run (`kube-apiserver`, `etcd` through PATH,
// /usr/local/bin/kube-proxy), so their images have no entrypoint; upstream's
// is /go-runner, a log wrapper kubeadm's commands bypass.
//
// coredns runs as upstream's, /coredns given kubeadm's arguments, but as
// root: upstream's runs as nonroot with a file capability to bind port 53;
// root with the capabilities kubeadm's Deployment leaves it (all dropped
// but NET_BIND_SERVICE) binds it with no xattr in the layer.
var kubeadmImages = []containerImage{
	{"kube-apiserver.tar", KubeAPIServerImage, &kubeAPIServerRecipe, v1.Config{Env: pathEnv}},
	{"kube-controller-manager.tar", KubeControllerManagerImage, &kubeControllerManagerRecipe, v1.Config{Env: pathEnv}},
	{"kube-scheduler.tar", KubeSchedulerImage, &kubeSchedulerRecipe, v1.Config{Env: pathEnv}},
	{"kube-proxy.tar", KubeProxyImage, &kubeProxyRecipe, v1.Config{Env: pathEnv}},
	{"coredns.tar", CoreDNSImage, &corednsRecipe, v1.Config{Entrypoint: []string{"/coredns"}, Env: pathEnv}},
	{"etcd.tar", EtcdImage, &etcdRecipe, v1.Config{Env: pathEnv}},
}

var (
	kubeAPIServerRecipe         = serverRecipe("usr/local/bin/kube-apiserver", "kube-apiserver")
	kubeControllerManagerRecipe = serverRecipe("usr/local/bin/kube-controller-manager", "kube-controller-manager")
	kubeSchedulerRecipe         = serverRecipe("usr/local/bin/kube-scheduler", "kube-scheduler")
	etcdRecipe                  = serverRecipe("usr/local/bin/etcd", "etcd")
	corednsRecipe               = serverRecipe("coredns", "coredns")
)

// kubeProxyRecipe: kube-proxy with what it runs in iptables mode, as
// upstream's distroless-iptables base carries it: iptables, iptables-save,
// iptables-restore and the ip6tables ones (pkg/util/iptables), on the nft
// backend as the guests' own iptables (the kubelet's), the legacy one
// beside it, and the extensions iptables loads by name. It runs no
// conntrack: kube-proxy clears conntrack entries over netlink.
var kubeProxyRecipe = func() layerRecipe {
	r := serverRecipe("usr/local/bin/kube-proxy", "kube-proxy")
	r.programs = map[string]string{
		"/usr/sbin/xtables-nft-multi":    "/usr/sbin/xtables-nft-multi",
		"/usr/sbin/xtables-legacy-multi": "/usr/sbin/xtables-legacy-multi",
	}
	r.pluginDirs = []string{xtablesDir}
	r.links = xtablesLinks()
	return r
}()

// serverRecipe is a layer of one static program hack/build-tools.sh
// builds, tool, at p, with the /etc files and /tmp of the distroless
// image upstream's are built on.
func serverRecipe(p, tool string) layerRecipe {
	return layerRecipe{
		tools: map[string]string{p: tool},
		files: withEtc(map[string]string{}),
		dirs:  map[string]int64{"tmp": 0o1777},
	}
}
