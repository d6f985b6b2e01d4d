#!/usr/bin/env bash
# The lab for a CI job: what action.yml runs, and what .ci/run exercises.
#   ci-lab.sh up     installs what is missing, builds (cached by version in
#                    LABCLOUD_CACHE), brings a lab of LABCLOUD_NODES and
#                    LABCLOUD_IP_FAMILY (ipv4, ipv6 or dual) up and waits
#                    up to LABCLOUD_WAIT; writes the host kubeconfig to
#                    LABCLOUD_KUBECONFIG and, under GitHub Actions, exports
#                    KUBECONFIG and kubectl's directory to the later steps.
#                    A failed up leaves its logs export in LABCLOUD_LOGS.
#   ci-lab.sh down   exports the lab's logs into LABCLOUD_LOGS, then takes it down.
# Runs as root (it re-runs itself with sudo when it is not).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
if [ "$(id -u)" -ne 0 ]; then
  exec sudo --preserve-env=RUNNER_TEMP,LABCLOUD_NODES,LABCLOUD_IP_FAMILY,LABCLOUD_WAIT,LABCLOUD_KUBERNETES,LABCLOUD_CACHE,LABCLOUD_KUBECONFIG,LABCLOUD_LOGS,LABCLOUD_ACCEL,GITHUB_ENV,GITHUB_PATH,PATH "$0" "$@"
fi
export PATH=/usr/local/go/bin:$PATH
nodes=${LABCLOUD_NODES:-2}
family=${LABCLOUD_IP_FAMILY:-ipv4}
wait=${LABCLOUD_WAIT:-10m}
kubeconfig=${LABCLOUD_KUBECONFIG:-${RUNNER_TEMP:-/tmp}/labcloud.kubeconfig}
logs=${LABCLOUD_LOGS:-${RUNNER_TEMP:-/tmp}/labcloud-logs}
lc="$repo/bin/labcloud"

# kvm_for_all lets every user open /dev/kvm, as hosted runners need (their
# /dev/kvm is root's); the lab's libvirtd runs QEMU as root either way.
kvm_for_all() {
  [ -e /dev/kvm ] || return 0
  echo 'KERNEL=="kvm", GROUP="kvm", MODE="0666", OPTIONS+="static_node=kvm"' >/etc/udev/rules.d/99-labcloud-kvm.rules
  udevadm control --reload-rules 2>/dev/null && udevadm trigger --name-match=kvm 2>/dev/null || chmod 0666 /dev/kvm
}

up() {
  cd "$repo"
  want=${LABCLOUD_KUBERNETES:-}
  have=$(cd hack/tools && go list -m -f '{{.Version}}' k8s.io/kubernetes 2>/dev/null || true)
  if [ -n "$want" ] && [ -n "$have" ] && [ "$want" != "$have" ]; then
    echo "ci-lab: Kubernetes $want was asked for; this labcloud builds $have" >&2
    exit 2
  fi
  kvm_for_all
  hack/install-deps.sh
  make build tools
  # A failed up removes the lab, so down would find nothing to export: up
  # writes its own export where down would, the one path a job uploads.
  rm -rf "$logs"
  "$lc" up --nodes "$nodes" --ip-family "$family" --wait "$wait" --logs-on-failure "$logs" || {
    rc=$?
    chmod -R a+rX "$logs" 2>/dev/null || true
    echo "ci-lab: up failed; its logs are in $logs" >&2
    exit "$rc"
  }
  "$lc" kubeconfig >"$kubeconfig"
  chmod 0644 "$kubeconfig"
  tools=$(hack/build-tools.sh | tail -1)
  if [ -n "${GITHUB_ENV:-}" ]; then
    echo "KUBECONFIG=$kubeconfig" >>"$GITHUB_ENV"
    echo "$tools" >>"$GITHUB_PATH"
  fi
  echo "ci-lab: KUBECONFIG=$kubeconfig (kubectl in $tools)"
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
