#!/usr/bin/env bash
# Installs what labcloud needs on Debian 12, Debian 13 or Ubuntu 24.04: the C
# library for the libvirt bindings, libvirt + QEMU + dnsmasq for the lab and
# the tests, the guest kernel, busybox and the tools that unpack its modules
# (xz, zstd) for lab VMs, FRR as the BGP router of tests, the
# programs the nodes' container images carry (curl, wget, nc, dig, nginx), and
# jq (hack/ci-lab.sh reads labcloud status), git, sudo and podman (the
# Action test: a runner's user with sudo builds an image), sshd, ssh-keygen
# and ssh-keyscan (a remote hypervisor over ssh in the tests and the lab of
# several hosts), and Go if it is missing or too old.
# Safe to run again: it only installs what is missing.
set -euo pipefail

# What differs per distribution, in one place. The guest kernel: Debian's
# cloud flavour; on Ubuntu the generic kernel with its base modules only
# (linux-image-virtual, what Ubuntu's own cloud images boot), because the
# kvm flavour is cut down further. lab/image/distro.go finds the kernel each
# of these installs; TestInstallDepsPackages checks that both agree.
# INSTALL_DEPS_DRY_RUN=1 prints the packages and stops; OS_RELEASE names
# another os-release file (for that test).
os_release=/etc/os-release
[ -r "$os_release" ] || os_release=/usr/lib/os-release
os_release=${OS_RELEASE:-$os_release}
id=$(. "$os_release" && echo "${ID:-}")
version=$(. "$os_release" && echo "${VERSION_ID:-}")
case "$id $version" in
  "debian 12" | "debian 13") guest_kernel=linux-image-cloud-amd64 ;;
  "ubuntu 24.04") guest_kernel=linux-image-virtual ;;
  *)
    echo "install-deps: unsupported distribution ID=$id VERSION_ID=$version in $os_release;" \
      "supported: debian 12, debian 13, ubuntu 24.04" >&2
    exit 1
    ;;
esac

packages=(
  build-essential pkg-config libvirt-dev
  libvirt-daemon libvirt-daemon-driver-qemu libvirt-daemon-config-network libvirt-clients
  qemu-system-x86 dnsmasq-base iptables iproute2 kmod tini
  busybox-static "$guest_kernel" runc e2fsprogs dhcpcd-base
  xz-utils zstd
  curl wget netcat-openbsd iputils-ping ca-certificates bc procps
  bind9-dnsutils nginx
  mmdebstrap systemd-container frr
  jq git sudo podman
  openssh-server openssh-client
)
if [ "${INSTALL_DEPS_DRY_RUN:-}" = 1 ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Tests run FRR's daemons and sshd in namespaces of their own, so the
  # host's routing and open ports stay as they were; nginx is only copied
  # into the nodes' nginx image.
  for pkg in frr nginx openssh-server; do
    units=$pkg
    [ "$pkg" = openssh-server ] && units="ssh.socket ssh.service"
    if [[ " ${missing[*]} " == *" $pkg "* ]] && command -v systemctl >/dev/null; then
      # shellcheck disable=SC2086 # two units for openssh-server
      systemctl disable --now $units >/dev/null 2>&1 || true
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
