#!/usr/bin/env bash
# Builds the control-plane binaries (kube-apiserver, kube-controller-manager,
# kubectl, etcd) from the module proxy into a cache directory keyed by version,
# outside the checkout. A second run with the binaries present does nothing.
# Prints the directory holding the binaries on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(cd "$here/tools" && go list -m -f "{{.Version}}" k8s.io/kubernetes)
etcd_version=$(cd "$here/tools" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
cache=${LABCLOUD_CACHE:-/var/cache/labcloud}
out="$cache/k8s-$version-etcd-$etcd_version"
bins=(kube-apiserver kube-controller-manager kubectl etcd)
missing=0
for b in "${bins[@]}"; do [ -x "$out/$b" ] || missing=1; done
if [ "$missing" = 1 ]; then
  echo "building control-plane binaries $version (etcd $etcd_version) into $out; a cold build takes ~10 minutes" >&2
  mkdir -p "$out.tmp"
  cd "$here/tools"
  export CGO_ENABLED=0
  go build -trimpath -ldflags='-s -w' -o "$out.tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kubectl
  go build -trimpath -ldflags='-s -w' -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3
  rm -rf "$out" && mv "$out.tmp" "$out"
fi
echo "$out"
