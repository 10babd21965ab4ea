#!/usr/bin/env bash
# Runs a go command that edits a module's go.mod (`go get`, `go mod tidy`)
# in the module directory DIR. Those commands ignore go.work's replaces, and
# the modules require each other at the candidate version, which the module
# proxy does not serve before its tag: this serves the working tree at that
# version from a file proxy (internal/modproxy) ahead of the usual one, and
# drops the siblings' checksums from go.sum afterwards (they change with
# every edit; the release commit adds them, RELEASING.md). The go command
# runs with a throwaway module cache: the candidate must never land in the
# shared one, where a later run would find a stale copy under the same
# version instead of asking the file proxy. Third-party modules come from
# the shared cache's download directory first, then from GOPROXY.
# Usage: scripts/gomod.sh DIR get example.com/x@v1.2.3
#        scripts/gomod.sh DIR mod tidy
#        scripts/gomod.sh all mod tidy    (every module go.work uses)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
GO=${GO:-go}
[ $# -ge 2 ] || { echo "usage: gomod.sh DIR|all GO-ARGS..." >&2; exit 2; }
target=$1
shift
cd "$root"
version=$(sed -n 's|^\tgithub.com/leasehold/leasehold v\(.*\)$|v\1|p' cmd/leasehold/go.mod)
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null || true; rm -rf "$tmp"' EXIT
(cd internal/modproxy && GOWORK=off $GO build -o "$tmp/modproxy" .)
"$tmp/modproxy" -root "$root" -version "$version" -out "$tmp/proxy" >/dev/null
if [ "$target" = all ]; then
  dirs=$(sed -n 's/^\t\(\.[^ ]*\)$/\1/p' go.work)
else
  dirs=$target
fi
real_proxy=$($GO env GOPROXY)
real_cache=$($GO env GOMODCACHE)
for d in $dirs; do
  echo "== (cd $d && go $*)"
  (cd "$d" && GOWORK=off GOFLAGS=-mod=mod GONOSUMDB=github.com/leasehold/leasehold GOMODCACHE="$tmp/modcache" \
    GOPROXY="file://$tmp/proxy,file://$real_cache/cache/download,$real_proxy" $GO "$@")
  if [ -f "$d/go.sum" ]; then
    grep -v '^github.com/leasehold/leasehold[ /]' "$d/go.sum" >"$tmp/go.sum" || true
    cat "$tmp/go.sum" >"$d/go.sum"
  fi
done
