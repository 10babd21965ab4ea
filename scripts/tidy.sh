#!/usr/bin/env bash
# `go mod tidy` in the given modules (default: every module go.work uses).
# The modules require each other at the candidate version, which the module
# proxy does not serve before the tag and which go.work's replaces do not
# reach (tidy ignores the workspace): this serves the working tree at that
# version from a file proxy (internal/modproxy) before the real one, and
# drops the siblings' checksums from go.sum afterwards (they change with
# every edit; the release commit adds them, RELEASING.md).
# Usage: scripts/tidy.sh [MODULE_DIR...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
GO=${GO:-go}
cd "$root"
version=$(sed -n 's|^\tgithub.com/leasehold/leasehold v\(.*\)$|v\1|p' cmd/leasehold/go.mod)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd internal/modproxy && GOWORK=off $GO build -o "$tmp/modproxy" .)
"$tmp/modproxy" -root "$root" -version "$version" -out "$tmp/proxy" >/dev/null
if [ $# -eq 0 ]; then
  set -- $(sed -n 's/^\t\(\.[^ ]*\)$/\1/p' go.work)
fi
real_proxy=$($GO env GOPROXY)
for m in "$@"; do
  echo "== go mod tidy $m"
  (cd "$m" && GOWORK=off GOFLAGS=-mod=mod GONOSUMDB=github.com/leasehold/leasehold \
    GOPROXY="file://$tmp/proxy,$real_proxy" $GO mod tidy)
  if [ -f "$m/go.sum" ]; then
    grep -v '^github.com/leasehold/leasehold[ /]' "$m/go.sum" >"$tmp/go.sum" || true
    cat "$tmp/go.sum" >"$m/go.sum"
  fi
done
