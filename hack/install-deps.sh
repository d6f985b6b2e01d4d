#!/usr/bin/env bash
# Installs what labcloud needs on a Debian/Ubuntu host: the C library for the
# libvirt bindings, libvirt + QEMU + dnsmasq for the lab and the tests, the
# guest kernel and busybox for lab VMs, FRR as the BGP router of tests, the
# programs the nodes' container images carry (curl, wget, nc, dig, nginx), and
# jq (hack/ci-lab.sh reads labcloud status), git, sudo and podman (the
# Action test: a runner's user with sudo builds an image), and Go if it is
# missing or too old.
# Safe to run again: it only installs what is missing.
set -euo pipefail
packages=(
  build-essential pkg-config libvirt-dev
  libvirt-daemon libvirt-daemon-driver-qemu libvirt-daemon-config-network libvirt-clients
  qemu-system-x86 dnsmasq-base iptables iproute2 kmod tini
  busybox-static linux-image-cloud-amd64 runc e2fsprogs dhcpcd-base
  curl wget netcat-openbsd iputils-ping ca-certificates bc procps
  bind9-dnsutils nginx
  mmdebstrap systemd-container frr
  jq git sudo podman
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Tests run FRR's daemons in namespaces of their own, so the host's routing
  # stays as it was; nginx is only copied into the nodes' nginx image.
  for svc in frr nginx; do
    if [[ " ${missing[*]} " == *" $svc "* ]] && command -v systemctl >/dev/null; then
      systemctl disable --now "$svc" >/dev/null 2>&1 || true
    fi
  done
fi

go_want=1.26
need_go=1
if command -v go >/dev/null; then
  have=$(go env GOVERSION | sed 's/^go//')
  [ "$(printf '%s\n%s\n' "$go_want" "$have" | sort -V | head -1)" = "$go_want" ] && need_go=0
fi
if [ "$need_go" = 1 ]; then
  v=$(curl -fsSL 'https://go.dev/VERSION?m=text' | head -1)
  echo "installing $v to /usr/local/go" >&2
  curl -fsSL "https://go.dev/dl/$v.linux-amd64.tar.gz" | tar -C /usr/local -xz
  echo "add /usr/local/go/bin to PATH" >&2
fi
