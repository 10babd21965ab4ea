#!/usr/bin/env bash
# Runs `go test -race` in every module, in two lanes side by side: the
# modules with the longest tests (etcdstore, cmd/leasehold with the drill)
# in one, the rest in the other. On the 2-core CI machine this takes about
# 7 minutes instead of 12 one after another. Each lane writes its own log,
# printed whole when it ends, so the output of the two does not interleave.
# Usage: gotest-lanes.sh "LANE 1 MODULES" "LANE 2 MODULES"
set -uo pipefail
GO=${GO:-go}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A lane runs all its modules even after a failure, so that one run shows
# every failing module.
lane() {
  local rc=0
  for m in "$@"; do
    echo "== go test $m"
    (cd "$root/$m" && $GO test -race -count=1 -timeout 20m ./...) || { echo "== FAIL in $m"; rc=1; }
  done
  return $rc
}

# shellcheck disable=SC2086 # the module lists are split on purpose
lane $1 >"$tmp/1" 2>&1 &
p1=$!
# shellcheck disable=SC2086
lane $2 >"$tmp/2" 2>&1 &
p2=$!
wait $p1; rc1=$?
cat "$tmp/1"
wait $p2; rc2=$?
cat "$tmp/2"
if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ]; then
  echo "gotest: FAIL (lane 1 exit $rc1, lane 2 exit $rc2)"
  exit 1
fi
