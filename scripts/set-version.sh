#!/usr/bin/env bash
# Makes VERSION the release being prepared: every module's requirement on a
# sibling, and the versioned replace lines of go.work, move to VERSION
# (RELEASING.md, step 1). scripts/release-check.sh then proves the modules
# at VERSION.
# Usage: scripts/set-version.sh vX.Y.Z
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
GO=${GO:-go}
version=${1:?usage: set-version.sh vX.Y.Z}
if ! [[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "set-version: $version is not a semantic version such as v0.2.0" >&2
  exit 2
fi
cd "$root"
for dir in $(sed -n 's/^\t\(\.[^ ]*\)$/\1/p' go.work); do
  for p in $(awk '/^require \($/ { r = 1; next } r && /^\)/ { r = 0; next } r { print $1 } /^require [^(]/ { print $2 }' "$dir/go.mod" |
    grep '^github.com/leasehold/leasehold' || true); do
    $GO mod edit -require="$p@$version" "$dir/go.mod"
  done
done
sed -i -E "s#^(\tgithub.com/leasehold/leasehold[^ ]*) v[^ ]+ => #\1 $version => #" go.work
grep -n '=> ' go.work
