#!/usr/bin/env bash
# Builds the release binaries of leasehold (RELEASING.md): static
# (CGO_ENABLED=0), -trimpath, stripped, with the Makefile's build tags and
# the version stamped (`leasehold version`), for every platform, plus
# SHA256SUMS. Offline: GOPROXY=off, so every module must already be in the
# module cache (the test run fills it). Then it builds every binary again
# from a copy of the tree in another directory, with an empty build cache,
# and fails unless the bytes are the same: the build is reproducible, and
# the checksums can be checked by anyone who builds the tag.
# Usage: release.sh VERSION [OUTDIR]   (OUTDIR default: bin/release/VERSION)
#   PLATFORMS="linux/amd64 ..." to build fewer (the CI check builds one).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
GO=${GO:-go}
version=${1:?usage: release.sh VERSION [OUTDIR]}
if ! [[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "release: VERSION $version is not a semantic version such as v0.1.0" >&2
  exit 2
fi
out=${2:-$root/bin/release/$version}
platforms=${PLATFORMS:-linux/amd64 linux/arm64 darwin/arm64 darwin/amd64}
tags=$(make -s -C "$root" --no-print-directory print-build-tags)
commit=$(git -C "$root" rev-parse HEAD)
if [ -n "$(git -C "$root" status --porcelain)" ]; then
  commit+="-dirty"
  echo "release: warning: the working tree has uncommitted changes; a release is built from its tag" >&2
fi
pkg=github.com/leasehold/leasehold/cmd/leasehold/internal/cli

# build SRC DEST: every platform from the tree at SRC into DEST.
build() {
  local src=$1 dest=$2 p os arch
  mkdir -p "$dest"
  for p in $platforms; do
    os=${p%/*} arch=${p#*/}
    # -buildvcs=false: the stamp is the -X below, the same from a tag's
    # checkout or its source archive. -buildid= : nothing of the machine.
    (cd "$src/cmd/leasehold" && CGO_ENABLED=0 GOOS=$os GOARCH=$arch GOPROXY=off GOFLAGS= \
      $GO build -trimpath -buildvcs=false -tags "$tags" \
      -ldflags "-s -w -buildid= -X $pkg.version=$version -X $pkg.commit=$commit" \
      -o "$dest/leasehold-$version-$os-$arch" .)
  done
}

rm -rf "$out"
echo "release: building leasehold $version ($commit) for $platforms"
build "$root" "$out"
(cd "$out" && sha256sum leasehold-* >SHA256SUMS)

# The same build from a copy of the tree elsewhere.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/src"
git -C "$root" ls-files -z --cached --others --exclude-standard |
  (cd "$root" && xargs -0 cp --parents -t "$tmp/src" 2>/dev/null) || true
# With a build cache of its own: the shared one would hand back the first
# build's objects (with -trimpath their keys do not name the directory),
# and the comparison would prove nothing.
GOCACHE="$tmp/gocache" build "$tmp/src" "$tmp/again"
chmod -R u+w "$tmp/gocache" 2>/dev/null || true
(cd "$tmp/again" && sha256sum leasehold-* >SHA256SUMS)
if ! cmp -s "$out/SHA256SUMS" "$tmp/again/SHA256SUMS"; then
  diff "$out/SHA256SUMS" "$tmp/again/SHA256SUMS" >&2 || true
  echo "release: FAIL: a second build from $tmp/src made other bytes: not reproducible" >&2
  exit 1
fi
echo "release: reproducible (built twice, from two directories, the second with an empty build cache: same bytes)"
host="$(go env GOOS)/$(go env GOARCH)"
if [[ " $platforms " == *" $host "* ]]; then
  got=$("$out/leasehold-$version-${host%/*}-${host#*/}" version | head -1)
  [ "$got" = "leasehold $version" ] || {
    echo "release: FAIL: the binary says '$got', want 'leasehold $version'" >&2
    exit 1
  }
  echo "release: $got"
fi
ls -l "$out"
cat "$out/SHA256SUMS"
