#!/usr/bin/env bash
# Builds every third-party binary the tests and the lab run, from the Go module
# proxy, into a cache directory keyed by version, outside the checkout:
#   control plane  kube-apiserver kube-controller-manager kube-scheduler kubectl etcd
#   lab nodes      kubelet kube-proxy agnhost pause containerd containerd-shim-runc-v2 ctr
#                  and the CNI plugins bridge host-local loopback portmap (in cni/)
#   cluster DNS    coredns (the plugins the lab's and kubeadm's Corefiles use, hack/dnstools)
#   conformance    e2e.test (Kubernetes' own e2e suite) and ginkgo (its parallel runner),
#                  left out with LABCLOUD_E2E=false (a CI job that never runs them)
#   the guide      kubeadm, with LABCLOUD_KUBEADM=true (make guide's kubeadm guests)
# Only missing binaries are built, so a warm cache makes this a no-op, and a
# later run that wants e2e.test builds only it and ginkgo into the same directory.
# Prints the directory holding the binaries on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
k8s=$(cd "$here/tools" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
etcd=$(cd "$here/tools" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
ctrd=$(cd "$here/nodetools" && go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
cni=$(cd "$here/nodetools" && go list -m -f '{{.Version}}' github.com/containernetworking/plugins)
coredns=$(cd "$here/dnstools" && go list -m -f '{{.Version}}' github.com/coredns/coredns)
cache=${LABCLOUD_CACHE:-/var/cache/labcloud}
out="$cache/k8s-$k8s-etcd-$etcd-containerd-$ctrd-cni-$cni"
mkdir -p "$out/cni"
export CGO_ENABLED=0 GOFLAGS=-trimpath

# missing PATH...: prints the import paths whose binary (the last path element) is not in $dir.
missing() { local p; for p in "$@"; do [ -x "$dir/${p##*/}" ] || echo "$p"; done; }

# Kubernetes reports the version stamped here (else v0.0.0-master): kubectl get
# nodes shows the kubelet's.
minor=${k8s#v1.}; minor=${minor%%.*}
kver="-X k8s.io/component-base/version.gitVersion=$k8s -X k8s.io/component-base/version.gitMajor=1"
kver="$kver -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
kver="$kver -X k8s.io/client-go/pkg/version.gitVersion=$k8s"

dir=$out
mapfile -t todo < <(missing k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/test/images/agnhost)
if [ ${#todo[@]} -gt 0 ]; then
  echo "building ${todo[*]##*/} $k8s into $out (cold, on 2 cores: most of the ~10.5 minutes every tool takes, docs/performance.md)" >&2
  (cd "$here/tools" && go build -ldflags="-s -w $kver" -o "$out/" "${todo[@]}")
fi
if [ ! -x "$out/etcd" ]; then
  echo "building etcd $etcd" >&2
  (cd "$here/tools" && go build -ldflags='-s -w' -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3 && mv "$out/etcd.tmp" "$out/etcd")
fi
kubeadm=${LABCLOUD_KUBEADM:-false}
if [ "$kubeadm" != true ] && [ "$kubeadm" != false ]; then
  echo "build-tools: LABCLOUD_KUBEADM=$kubeadm: want true or false" >&2
  exit 2
fi
if [ "$kubeadm" = true ] && [ ! -x "$out/kubeadm" ]; then
  echo "building kubeadm $k8s (cold: ~1 minute after the others)" >&2
  (cd "$here/tools" && go build -ldflags="-s -w $kver" -o "$out/kubeadm.tmp" k8s.io/kubernetes/cmd/kubeadm && mv "$out/kubeadm.tmp" "$out/kubeadm")
fi
e2e=${LABCLOUD_E2E:-true}
if [ "$e2e" != true ] && [ "$e2e" != false ]; then
  echo "build-tools: LABCLOUD_E2E=$e2e: want true or false" >&2
  exit 2
fi
if [ "$e2e" = true ] && [ ! -x "$out/e2e.test" ]; then
  echo "building e2e.test $k8s (cold: ~6 minutes)" >&2
  (cd "$here/tools" && go test -c -ldflags="-s -w $kver" -o "$out/e2e.test.tmp" k8s.io/kubernetes/test/e2e && mv "$out/e2e.test.tmp" "$out/e2e.test")
fi
if [ "$e2e" = true ] && [ ! -x "$out/ginkgo" ]; then
  # The runner of the Ginkgo version e2e.test is built with.
  echo "building ginkgo" >&2
  (cd "$here/tools" && go build -ldflags='-s -w' -o "$out/ginkgo.tmp" github.com/onsi/ginkgo/v2/ginkgo && mv "$out/ginkgo.tmp" "$out/ginkgo")
fi
if [ ! -x "$out/pause" ]; then
  # The pod sandbox, from Kubernetes' own source at the same version.
  pause_version=3.10.2
  kdir=$(cd "$here/tools" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
  echo "building pause $pause_version" >&2
  gcc -Os -static -Wall -Werror -DVERSION="$pause_version" -o "$out/pause.tmp" "$kdir/build/pause/linux/pause.c"
  strip "$out/pause.tmp" && mv "$out/pause.tmp" "$out/pause"
fi
if [ ! -f "$out/porter/localhost.key" ]; then
  # agnhost porter's TLS pair, which upstream's agnhost image carries at /.
  kdir=$(cd "$here/tools" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
  mkdir -p "$out/porter"
  cp "$kdir/test/images/agnhost/porter/localhost.crt" "$kdir/test/images/agnhost/porter/localhost.key" "$out/porter/"
  chmod 0644 "$out/porter/localhost.crt" "$out/porter/localhost.key"
fi
mapfile -t todo < <(missing github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr)
if [ ${#todo[@]} -gt 0 ]; then
  echo "building containerd $ctrd" >&2
  ldv="-X github.com/containerd/containerd/v2/version.Version=$ctrd"
  (cd "$here/nodetools" && go build -tags 'no_btrfs no_devmapper no_zfs' -ldflags="-s -w $ldv" -o "$out/" "${todo[@]}")
fi
dir=$out/cni
mapfile -t todo < <(missing github.com/containernetworking/plugins/plugins/main/bridge \
  github.com/containernetworking/plugins/plugins/ipam/host-local \
  github.com/containernetworking/plugins/plugins/main/loopback github.com/containernetworking/plugins/plugins/meta/portmap)
if [ ${#todo[@]} -gt 0 ]; then
  echo "building CNI plugins $cni" >&2
  (cd "$here/nodetools" && go build -ldflags='-s -w' -o "$out/cni/" "${todo[@]}")
fi
# CoreDNS is not part of the directory's key: coredns.key holds a hash of
# its recipe (version and plugin list), and a change rebuilds it.
dnskey=$(cd "$here/dnstools" && cat go.mod go.sum coredns/main.go | sha256sum | cut -c1-16)
if [ ! -x "$out/coredns" ] || [ "$(cat "$out/coredns.key" 2>/dev/null)" != "$dnskey" ]; then
  echo "building coredns $coredns" >&2
  (cd "$here/dnstools" && go build -ldflags='-s -w' -o "$out/coredns.tmp" ./coredns && mv "$out/coredns.tmp" "$out/coredns")
  echo "$dnskey" >"$out/coredns.key"
fi
# The marker says every binary the lab runs is here (e2e.test and ginkgo are
# labcloud e2e's, which looks for them): a half-built cache is never taken
# for a full one.
touch "$out/.complete"
echo "$out"
