#!/usr/bin/env bash
# CI's run of the script users run in CI (action.yml, docs/ci.md), end to
# end, on a dual-stack lab: kubectl with the kubeconfig it writes, then
# upstream's tests on the same lab, CI's one run of them: a representative
# subset (dual-stack nodes, pods and Services, the secondary family through
# kube-proxy, LoadBalancer Services with either traffic policy, health check
# node ports, UDP, session affinity through the spread routes), in two
# processes so that a slow host keeps its pods within upstream's timeouts.
# Logs exported, lab down. make conformance runs them all. Root; make test
# runs it after the Go tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
export LABCLOUD_NODES=2 LABCLOUD_IP_FAMILY=dual LABCLOUD_E2E=true LABCLOUD_KUBECONFIG=/tmp/ci-lab.kubeconfig LABCLOUD_LOGS=/tmp/ci-lab-logs
trap 'hack/ci-lab.sh down' EXIT
hack/ci-lab.sh up
"$(hack/build-tools.sh | tail -1)/kubectl" --kubeconfig "$LABCLOUD_KUBECONFIG" wait --for=condition=Ready node --all --timeout=60s
focus=$(cat <<'F'
\[Feature:IPv6DualStack\] should have at least one dual-stack node
\[Feature:IPv6DualStack\] should create pod, add ipv6 and ipv4 ip to pod ips
\[Feature:IPv6DualStack\] should create service with ipv4,v6 cluster ip
Secondary IP Family \[LinuxOnly\] should function for pod-Service: http
should handle load balancer cleanup finalizer for service
should be able to create LoadBalancer Service without NodePort and change it
should have session affinity work for LoadBalancer service with Cluster traffic policy
should be able to switch session affinity for LoadBalancer service with Local traffic policy
ExternalTrafficPolicy: Local \[Feature:LoadBalancer\] \[Slow\] should target all nodes with endpoints
ExternalTrafficPolicy: Local \[Feature:LoadBalancer\] \[Slow\] should work from pods
should fail health check node port if there are only terminating endpoints
should be able to preserve UDP traffic when server pod cycles for a LoadBalancer service on different nodes
F
)
bin/labcloud e2e --junit-dir /tmp/ci-lab-e2e --timeout 30m --parallel 2 \
  --focus "$(paste -sd'|' <<<"$focus")" | tee /tmp/ci-lab-e2e.out
# Every line of the focus must have run and passed: a renamed upstream test
# would otherwise drop out of the focus unseen.
want=$(wc -l <<<"$focus")
grep -qx "$want passed, 0 failed, [0-9]* skipped" /tmp/ci-lab-e2e.out || {
  echo "ci: upstream e2e: want $want passed: $(tail -1 /tmp/ci-lab-e2e.out)" >&2
  exit 1
}
trap - EXIT
hack/ci-lab.sh down
test -s "$LABCLOUD_LOGS/ccm.log" && test -s "$LABCLOUD_LOGS/status.json"
