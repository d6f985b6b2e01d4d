#!/usr/bin/env bash
# make conformance: Kubernetes' own e2e tests (labcloud e2e) on a fresh
# three-node lab per run, each taken down afterwards whatever its outcome.
# The runs (CONFORMANCE_RUNS, default all of them, in this order):
#   loadbalancer-ipv4  the default focus (docs/conformance.md) on an ipv4 lab
#   loadbalancer-ipv6  the same on an ipv6 lab
#   dualstack          the [Feature:IPv6DualStack] tests on a dual lab
#   sig-network        the [sig-network] [Conformance] tests on an ipv4 lab
#   moved              TestLabMoved: up --subnet and --pod-cidr on a host that
#                      routes the defaults (test/labe2e)
#   action-cold        the GitHub Action's first run, its cache empty (every
#                      tool built as the runner's user), then one with the
#                      cache it saved (test/action; make test runs only the
#                      second kind)
#   guide              make guide: docs/install-kubeadm.md's blocks run as
#                      written on Debian guests with kubeadm, on a KVM host
#                      set up as Debian ships libvirt (test/guide)
# Each writes its JUnit report and log into CONFORMANCE_DIR/RUN;
# CONFORMANCE_ARGS adds labcloud e2e flags to every run. Exits non-zero when
# any run fails. Root; about 25-40 minutes a run on TCG guests.
set -uo pipefail
lc=${BIN:-bin}/labcloud
dir=${CONFORMANCE_DIR:-labcloud-e2e}
runs=${CONFORMANCE_RUNS:-loadbalancer-ipv4 loadbalancer-ipv6 dualstack sig-network moved action-cold guide}
# Shell words, so that a quoted --focus keeps its spaces.
eval "extra=(${CONFORMANCE_ARGS:-})"

failed=()
for run in $runs; do
  case $run in
    moved | action-cold | guide)
      mkdir -p "$dir/$run"
      if [ "$run" = guide ]; then
        echo "== $run: test/guide with LABCLOUD_GUIDE=1"
        LABCLOUD_GUIDE=1 go test -count=1 -timeout 80m -v -run '^TestGuide$' ./test/guide/ >"$dir/$run/test.log" 2>&1 || failed+=("$run")
      elif [ "$run" = moved ]; then
        echo "== $run: TestLabMoved (test/labe2e)"
        LABCLOUD_LAB_MOVED=1 go test -count=1 -timeout 30m -v -run '^TestLabMoved$' ./test/labe2e/ >"$dir/$run/test.log" 2>&1 || failed+=("$run")
      else
        echo "== $run: test/action with LABCLOUD_ACTION_COLD=1"
        LABCLOUD_ACTION_COLD=1 go test -count=1 -timeout 90m -v -run '^TestActionAsUsersCallIt$' ./test/action/ >"$dir/$run/test.log" 2>&1 || failed+=("$run")
        grep '^action:' "$dir/$run/test.log"
      fi
      continue
      ;;
  esac
  case $run in
    loadbalancer-ipv4) family=ipv4 args=() ;;
    loadbalancer-ipv6) family=ipv6 args=() ;;
    dualstack) family=dual args=(--focus '\[Feature:IPv6DualStack\]') ;;
    sig-network) family=ipv4 args=(--focus '\[sig-network\].*\[Conformance\]') ;;
    *) echo "conformance: unknown run $run (CONFORMANCE_RUNS)" >&2; exit 2 ;;
  esac
  echo "== $run: up --nodes 3 --ip-family $family"
  if "$lc" up --nodes 3 --ip-family "$family"; then
    "$lc" e2e --junit-dir "$dir/$run" "${args[@]}" "${extra[@]}" || failed+=("$run")
  else
    failed+=("$run")
  fi
  "$lc" down || failed+=("$run (down)")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "conformance: failed: ${failed[*]}" >&2
  exit 1
fi
echo "conformance: passed: $runs"
