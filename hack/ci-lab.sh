#!/usr/bin/env bash
# The lab for a CI job: what action.yml runs, and what .ci/run exercises.
#   ci-lab.sh up     installs what is missing, builds (cached by version in
#                    LABCLOUD_CACHE; e2e.test and ginkgo only with
#                    LABCLOUD_E2E=true), replaces a lab an earlier job left,
#                    brings a lab of LABCLOUD_NODES and LABCLOUD_IP_FAMILY
#                    (ipv4, ipv6 or dual), with LABCLOUD_CLOUD_CONFIG as the
#                    CCM's cloud config when set, up and waits up to
#                    LABCLOUD_WAIT; writes the host kubeconfig to
#                    LABCLOUD_KUBECONFIG. Under GitHub Actions it exports
#                    KUBECONFIG and LABCLOUD_LOGS, puts kubectl and labcloud
#                    on the PATH of later steps, and sets the outputs
#                    kubeconfig, labcloud and vip-range.
#                    A failed up leaves its logs export in LABCLOUD_LOGS.
#   ci-lab.sh down   exports the lab's logs into LABCLOUD_LOGS, then takes it down.
# Runs as root (it re-runs itself with sudo when it is not).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
if [ "$(id -u)" -ne 0 ]; then
  exec sudo --preserve-env=RUNNER_TEMP,LABCLOUD_NODES,LABCLOUD_IP_FAMILY,LABCLOUD_WAIT,LABCLOUD_KUBERNETES,LABCLOUD_CACHE,LABCLOUD_KUBECONFIG,LABCLOUD_LOGS,LABCLOUD_ACCEL,LABCLOUD_E2E,LABCLOUD_CLOUD_CONFIG,GOCACHE,GOMODCACHE,GOPROXY,GITHUB_ENV,GITHUB_PATH,GITHUB_OUTPUT,PATH "$0" "$@"
fi
export PATH=/usr/local/go/bin:$PATH
nodes=${LABCLOUD_NODES:-2}
family=${LABCLOUD_IP_FAMILY:-ipv4}
wait=${LABCLOUD_WAIT:-10m}
# Paths are taken from where the job stands, before up moves to the checkout.
kubeconfig=$(realpath -m "${LABCLOUD_KUBECONFIG:-${RUNNER_TEMP:-/tmp}/labcloud.kubeconfig}")
logs=$(realpath -m "${LABCLOUD_LOGS:-${RUNNER_TEMP:-/tmp}/labcloud-logs}")
cloud_config=${LABCLOUD_CLOUD_CONFIG:+$(realpath -m "$LABCLOUD_CLOUD_CONFIG")}
export LABCLOUD_E2E=${LABCLOUD_E2E:-false}
lc="$repo/bin/labcloud"
# labcloud's default --state-dir: up refuses while a state is there.
state=/var/lib/labcloud/lab/state.json

# kvm_for_all lets every user open /dev/kvm, as hosted runners need (their
# /dev/kvm is root's); the lab's libvirtd runs QEMU as root either way. A
# container (GitLab's docker executor) has no udev: there the mode is set.
kvm_for_all() {
  [ -e /dev/kvm ] || return 0
  if command -v udevadm >/dev/null && [ -d /etc/udev/rules.d ]; then
    echo 'KERNEL=="kvm", GROUP="kvm", MODE="0666", OPTIONS+="static_node=kvm"' >/etc/udev/rules.d/99-labcloud-kvm.rules
    udevadm control --reload-rules 2>/dev/null && udevadm trigger --name-match=kvm 2>/dev/null && return 0
  fi
  chmod 0666 /dev/kvm
}

# github NAME=VALUE...: appends to the file $GITHUB_<NAME> (ENV, OUTPUT,
# PATH) for the later steps of a GitHub Actions job; nothing elsewhere.
github() {
  local file=$1; shift
  [ -n "${!file:-}" ] || return 0
  printf '%s\n' "$@" >>"${!file}"
}

# vip_range: the addresses of the pools the lab's CCM allocates from,
# comma-separated, as labcloud status reads them from its cloud config.
vip_range() {
  "$lc" status -o json | jq -r '[.pools[]?.addresses[]] | join(",")'
}

up() {
  cd "$repo"
  want=${LABCLOUD_KUBERNETES:-}
  have=$(cd hack/tools && go list -m -f '{{.Version}}' k8s.io/kubernetes 2>/dev/null || true)
  if [ -n "$want" ] && [ -n "$have" ] && [ "$want" != "$have" ]; then
    echo "ci-lab: Kubernetes $want was asked for; this labcloud builds $have" >&2
    exit 2
  fi
  if [ -n "$cloud_config" ] && [ ! -f "$cloud_config" ]; then
    echo "ci-lab: cloud config $cloud_config: no such file" >&2
    exit 2
  fi
  # The cleanup step finds the logs here, even after a failed up.
  github GITHUB_ENV "LABCLOUD_LOGS=$logs"
  kvm_for_all
  hack/install-deps.sh
  make build
  # The tools are cached by version, so their objects (GBs of Kubernetes)
  # would only swell the Go cache a GitHub job saves: the job's temporary
  # directory takes them.
  if [ -n "${RUNNER_TEMP:-}" ]; then
    GOCACHE=$RUNNER_TEMP/labcloud-tools-gocache make tools
  else
    make tools
  fi
  # A self-hosted runner keeps the lab of a job cancelled before its
  # cleanup step; up would refuse to start beside it.
  if [ -e "$state" ]; then
    echo "ci-lab: replacing a lab left by an earlier job"
    "$lc" down
  fi
  # A failed up removes the lab, so down would find nothing to export: up
  # writes its own export where down would, the one path a job uploads.
  rm -rf "$logs"
  "$lc" up --nodes "$nodes" --ip-family "$family" --wait "$wait" --logs-on-failure "$logs" \
    ${cloud_config:+--cloud-config "$cloud_config"} || {
    rc=$?
    chmod -R a+rX "$logs" 2>/dev/null || true
    echo "ci-lab: up failed; its logs are in $logs" >&2
    exit "$rc"
  }
  "$lc" kubeconfig >"$kubeconfig"
  chmod 0644 "$kubeconfig"
  tools=$(hack/build-tools.sh | tail -1)
  vips=$(vip_range) || vips=
  [ -n "$vips" ] || echo "ci-lab: labcloud status names no VIP pool: the vip-range output is empty" >&2
  github GITHUB_ENV "KUBECONFIG=$kubeconfig"
  github GITHUB_PATH "$tools" "$repo/bin"
  github GITHUB_OUTPUT "kubeconfig=$kubeconfig" "labcloud=$lc" "vip-range=$vips"
  echo "ci-lab: KUBECONFIG=$kubeconfig (kubectl in $tools), labcloud $lc, VIPs $vips"
}

down() {
  cd "$repo"
  rc=0
  if [ -x "$lc" ] && "$lc" status >/dev/null 2>&1; then
    rm -rf "$logs"
    "$lc" export logs "$logs" || rc=$?
    chmod -R a+rX "$logs" 2>/dev/null || true
    echo "ci-lab: logs in $logs"
  fi
  [ -x "$lc" ] && "$lc" down || true
  return $rc
}

case "${1:-}" in
up) up ;;
down) down ;;
*) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
