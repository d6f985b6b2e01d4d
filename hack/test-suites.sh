#!/usr/bin/env bash
# make test's suites, in order, stopping at the first that fails: the Go
# tests, the CI conformance subset (hack/ci-e2e.sh) and the fuzz targets.
# Ends with each suite's time, and each Go package's that took 10 s or
# more, so the CI budget is visible in every run.
set -uo pipefail
out=$(mktemp); trap 'rm -f "$out"' EXIT
times=() start=$SECONDS failed=0
run() {
  local name=$1 s=$SECONDS rc; shift
  "$@"; rc=$?
  times+=("$(printf '  %-28s %5d s%s' "$name" $((SECONDS - s)) "$([ $rc = 0 ] || echo '  FAILED')")")
  return $rc
}
summary() {
  echo "== suite times"
  printf '%s\n' "${times[@]}"
  awk '$1 == "ok" || $1 == "FAIL" { t = $3; sub(/s$/, "", t); if (t + 0 >= 10) printf "    %-40s %5d s\n", $2, t }' "$out" | sort -k2 -n -r
  printf '  %-28s %5d s\n' total $((SECONDS - start))
  echo "packages: $(grep -c '^ok' "$out") passed, $(grep -c '^FAIL	' "$out") failed"
}
run "go test ./..." bash -o pipefail -c 'go test -count=1 -timeout 80m ./... 2>&1 | tee "$1"' _ "$out" || failed=1
[ $failed = 0 ] && { run hack/ci-e2e.sh hack/ci-e2e.sh || failed=1; }
[ $failed = 0 ] && { run "make fuzz" make --no-print-directory fuzz || failed=1; }
summary
exit $failed
