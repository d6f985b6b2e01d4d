#!/usr/bin/env bash
# Prints labcloud's version for -ldflags: `git describe` of the nearest v* tag,
# or, with no tag in the history (a shallow CI clone), v0.1.0 plus the commit
# count and hash in git describe's own form. "-dirty" marks uncommitted changes.
set -euo pipefail
cd "$(dirname "$0")/.."
if v=$(git describe --tags --match 'v*' --dirty 2>/dev/null); then
  echo "$v"; exit 0
fi
dirty=""
git diff --quiet HEAD 2>/dev/null || dirty=-dirty
echo "v0.1.0-$(git rev-list --count HEAD)-g$(git rev-parse --short HEAD)$dirty"
