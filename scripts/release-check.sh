#!/usr/bin/env bash
# Proves, without the network, that the modules install and build as a new
# user would fetch them once the candidate version is tagged (issue 31,
# RELEASING.md). It writes every module of the working tree at the
# candidate into a file GOPROXY (internal/modproxy: it refuses a replace, a
# sibling at another version, a requirement on an unpublished helper), then,
# in empty directories, with no go.work and no replace:
#   - go install github.com/leasehold/leasehold/cmd/leasehold@VERSION, and
#     `leasehold version` must name VERSION;
#   - per store, a program importing the root package and the store: go get,
#     go mod tidy, go build; its `go list -m all` must stay within the
#     store's limit, and its go line must stay at the library's (go mod
#     tidy -e: offline, tidy cannot load the tests of old dependencies);
#   - the README's quickstart (the ```go block that starts with
#     `package main`) and every module's example_test.go, built against
#     the proxy.
# Our modules come from the file proxy, third-party ones from the module
# cache (GOMODCACHE/cache/download is a proxy too), which a first step
# fills with the versions each module selects (the only step that may use
# the network, never for our modules; RELEASE_CHECK_OFFLINE=1 skips it):
# the proof itself runs with no proxy but those two. GOSUMDB=off: the cache
# verified third-party modules when it downloaded them, and no checksum
# database knows an untagged version.
# Usage: release-check.sh [VERSION]   (default: the version the modules
# require each other at)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
GO=${GO:-go}
cd "$root"
version=${1:-$(sed -n 's|^\tgithub.com/leasehold/leasehold v\(.*\)$|v\1|p' cmd/leasehold/go.mod)}
[ -n "$version" ] || { echo "release-check: FAIL: no version given and none found in cmd/leasehold/go.mod" >&2; exit 1; }
# Issue 31's limits. etcd: the issue asked for 45, "the etcd client's own
# graph", but a program importing only go.etcd.io/etcd/client/v3 lists 79
# modules at v3.7.3 (grpc's go.mod alone requires 41): the limit is that
# program's count, measured here at the version etcdstore requires, plus
# ETCD_MARGIN for the library's own requirements.
MAX_REDIS=${MAX_REDIS:-20} MAX_PG=${MAX_PG:-25} ETCD_MARGIN=${ETCD_MARGIN:-6}
tags=$(make -s --no-print-directory print-build-tags)
mingo=$($GO mod edit -json go.mod | sed -n 's/^\t"Go": "\(.*\)",$/\1/p')

real_cache=$($GO env GOMODCACHE)
tmp=$(mktemp -d)
cleanup() { chmod -R u+w "$tmp" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
# A module cache of its own, new at every run: the candidate never lands in
# the shared one, and the go command, which takes a module cache to be
# immutable (its package index), never sees another run's candidate under
# the same path. -trimpath keeps the directory out of the build cache's
# keys, so third-party packages still compile once.
cache=$tmp/modcache

fail=0
problem() { echo "release-check: FAIL: $*" >&2; fail=1; }
start=$(date +%s)

echo "release-check: modules at $version as a file proxy (internal/modproxy)"
# Built in its own module, outside the workspace: a broken go.mod elsewhere
# must not keep it from saying what is wrong.
(cd internal/modproxy && GOWORK=off $GO build -o "$tmp/modproxy" .)
"$tmp/modproxy" -root "$root" -version "$version" -out "$tmp/proxy" >"$tmp/modproxy.out" 2>&1 || {
  cat "$tmp/modproxy.out" >&2
  echo "release-check: FAIL: the modules cannot be served at $version" >&2
  exit 1
}
sed 's/^/  /' "$tmp/modproxy.out"

# The one step that may use the network, and only for third-party modules:
# every version that a module of ours selects on its own (a workspace
# selects the highest of all, so the test run may not have downloaded the
# others) goes into the shared module cache. Ours never do: their go.mod
# files are read through a throwaway cache. RELEASE_CHECK_OFFLINE=1 skips
# it (the cache must then hold them already).
if [ "${RELEASE_CHECK_OFFLINE:-}" != 1 ]; then
  echo "release-check: third-party modules each module selects, into the module cache"
  real_proxy=$($GO env GOPROXY)
  while read -r dir; do
    # A copy of go.mod and go.sum: listing may add go.sum lines.
    mkdir -p "$tmp/list/$dir"
    cp "$dir/go.mod" "$tmp/list/$dir/"
    [ ! -f "$dir/go.sum" ] || cp "$dir/go.sum" "$tmp/list/$dir/"
    (cd "$tmp/list/$dir" && GOWORK=off GOFLAGS=-mod=mod GOMODCACHE="$tmp/listcache" GONOSUMDB=github.com/leasehold/leasehold \
      GOPROXY="file://$tmp/proxy,file://$real_cache/cache/download,$real_proxy" \
      $GO list -m -e -f '{{if not .Main}}{{.Path}}@{{.Version}}{{end}}' all) | grep -v '^github.com/leasehold/leasehold[/@]' || true
  done < <(sed -n 's/^\t\(\.[^ ]*\)$/\1/p' go.work | grep -v '^\./internal/') | sort -u >"$tmp/thirdparty"
  chmod -R u+w "$tmp/listcache" 2>/dev/null || true
  mkdir -p "$tmp/dl"
  (cd "$tmp/dl" && GOWORK=off GOFLAGS=-mod=mod xargs $GO mod download <"$tmp/thirdparty") || {
    problem "downloading the third-party modules failed"
  }
  echo "  $(wc -l <"$tmp/thirdparty") modules"
fi

export GOWORK=off GOFLAGS="-modcacherw -trimpath" GOTOOLCHAIN=local GOSUMDB=off GOMODCACHE="$cache"
export GOPROXY="file://$tmp/proxy,file://$real_cache/cache/download"
unset GONOSUMDB GONOPROXY GOPRIVATE GOINSECURE

# newmod DIR: an empty module as a user starts one, at the library's go line.
newmod() {
  mkdir -p "$1"
  printf 'module example.com/%s\n\ngo %s\n' "$(basename "$1")" "$mingo" >"$1/go.mod"
}
# gotidy DIR MODULE...: go get the modules at the candidate, tidy, build.
gotidy() {
  local dir=$1
  shift
  local mods=()
  for m in "$@"; do mods+=("$m@$version"); done
  # tidy -e: offline, tidy cannot load the tests of dependencies whose
  # go.mod predates graph pruning (go.uber.org/atomic's), which a build
  # never needs; the build after it needs every module it uses.
  (cd "$dir" && $GO get "${mods[@]}" && $GO mod tidy -e && $GO build ./... && $GO vet ./...) >"$dir.log" 2>&1 || {
    sed 's/^/    /' "$dir.log" >&2
    problem "$(basename "$dir"): go get ${mods[*]} / go mod tidy / go build failed"
    return 1
  }
  # The user's go line may rise to the go line of a module they asked for
  # (etcdstore's is etcd's), never above it.
  local got want=$mingo m g
  for m in "$@"; do
    g=$(golineof "$m")
    want=$(printf '%s\n%s\n' "$want" "$g" | sort -V | tail -1)
  done
  got=$(sed -n 's/^go //p' "$dir/go.mod")
  echo "  $(basename "$dir"): the user's go line: $mingo -> $got (the modules': $want)"
  if [ "$(printf '%s\n%s\n' "$want" "$got" | sort -V | tail -1)" != "$want" ]; then
    problem "$(basename "$dir"): go get raised the user's go line from $mingo to $got, above the go $want of the modules asked for"
  fi
}
# golineof MODULE: the go line of one of our modules.
golineof() {
  local d=${1#github.com/leasehold/leasehold}
  sed -n 's/^go //p' "$root/${d#/}${d:+/}go.mod"
}

echo "release-check: go install github.com/leasehold/leasehold/cmd/leasehold@$version"
mkdir -p "$tmp/install" "$tmp/bin"
if (cd "$tmp/install" && GOBIN="$tmp/bin" $GO install -tags "$tags" "github.com/leasehold/leasehold/cmd/leasehold@$version") >"$tmp/install.log" 2>&1; then
  out=$("$tmp/bin/leasehold" version 2>&1 | head -1) || true
  echo "  leasehold version: $out"
  case "$out" in
  *"$version"*) ;;
  *) problem "'leasehold version' of the installed binary does not name $version: $out" ;;
  esac
else
  sed 's/^/    /' "$tmp/install.log" >&2
  problem "go install github.com/leasehold/leasehold/cmd/leasehold@$version failed"
fi

# Programs importing the root package and one store; the limits of issue 31.
store_prog() { # NAME IMPORT EXPR MODULE...
  local dir=$tmp/$1 imp=$2 expr=$3
  shift 3
  newmod "$dir"
  cat >"$dir/main.go" <<GO
package main

import (
	"fmt"

	"github.com/leasehold/leasehold"
	store "$imp"
)

var _ = $expr

func main() { fmt.Println(leasehold.ErrNotAcquired) }
GO
  gotidy "$dir" "$@"
}
count() { # NAME LIMIT
  local n
  [ -f "$tmp/$1/go.sum" ] || return 0
  n=$(cd "$tmp/$1" && $GO list -m -e all | wc -l)
  echo "  root + $1: $n modules (limit $2)"
  if [ "$n" -gt "$2" ]; then
    (cd "$tmp/$1" && $GO list -m -e all | sed 's/^/    /')
    problem "a program importing leasehold + $1 lists $n modules > $2"
  fi
}
echo "release-check: a program per store (go list -m all counts the program itself)"
store_prog redisstore github.com/leasehold/leasehold/redisstore 'store.New' github.com/leasehold/leasehold && count redisstore "$MAX_REDIS"
store_prog pgstore github.com/leasehold/leasehold/pgstore 'store.Open' github.com/leasehold/leasehold/pgstore && count pgstore "$MAX_PG"
etcdv=$(awk '$1 == "go.etcd.io/etcd/client/v3" { print $2 }' etcdstore/go.mod)
base=$tmp/etcdclient
mkdir -p "$base"
# etcdstore's requirements less ours, so that the versions are those the
# cache holds.
grep -v '^module \|github.com/leasehold/leasehold' etcdstore/go.mod >"$base/go.mod"
sed -i '1i module example.com/etcdclient' "$base/go.mod"
printf 'package main\n\nimport clientv3 "go.etcd.io/etcd/client/v3"\n\nvar _ = clientv3.New\n\nfunc main() {}\n' >"$base/main.go"
if (cd "$base" && $GO mod tidy -e && $GO build ./...) >"$base.log" 2>&1; then
  n=$(cd "$base" && $GO list -m -e all | wc -l)
  MAX_ETCD=${MAX_ETCD:-$((n + ETCD_MARGIN))}
  echo "  go.etcd.io/etcd/client/v3 $etcdv alone: $n modules"
else
  sed 's/^/    /' "$base.log" >&2
  problem "a program importing only go.etcd.io/etcd/client/v3@$etcdv does not build offline"
  MAX_ETCD=${MAX_ETCD:-0}
fi
store_prog etcdstore github.com/leasehold/leasehold/etcdstore 'store.Open' github.com/leasehold/leasehold/etcdstore && count etcdstore "$MAX_ETCD"

echo "release-check: the README's quickstart and every module's Example"
ex=$tmp/examples
newmod "$ex"
mkdir -p "$ex/quickstart"
awk '/^```go$/ { inblock = 1; n = 0; next }
     inblock && /^```$/ { inblock = 0; if (keep) exit; next }
     inblock { n++; if (n == 1 && $0 == "package main") keep = 1; if (keep) print }' README.md >"$ex/quickstart/main.go"
[ -s "$ex/quickstart/main.go" ] || problem "README.md has no \`\`\`go block that starts with 'package main' (the quickstart)"
mods=()
while read -r dir; do
  m=github.com/leasehold/leasehold${dir#.}
  case "$dir" in ./internal/* | ./cmd/*) continue ;; esac
  mods+=("$m")
done < <(sed -n 's/^\t\(\.[^ ]*\)$/\1/p' go.work)
for f in $(git ls-files '*example_test.go'); do
  case "$f" in cmd/* | internal/*) continue ;; esac
  # As a plain package: a user's build, not the tests of dependencies,
  # which offline tidy could not load.
  d=$ex/$(dirname "$f" | tr / _)
  mkdir -p "$d"
  sed '1s/^package .*/package examples/' "$f" >"$d/example.go"
done
gotidy "$ex" "${mods[@]}" || problem "the examples do not build against the proxy"
echo "  built: quickstart and $(find "$ex" -name 'example.go' | wc -l) example files against ${#mods[@]} modules"

# A module's go line is the lowest that builds when one of its requirements
# (all of them are listed, go >= 1.17) needs it, or it is the root's (the
# library's declared floor: the code may need it, and no older toolchain is
# at hand to try).
echo "release-check: go lines (the library's: go $mingo)"
escape() { sed 's/[A-Z]/!\L&/g' <<<"$1"; }
for m in "${mods[@]}" github.com/leasehold/leasehold/cmd/leasehold; do
  [ "$m" = github.com/leasehold/leasehold ] && continue
  d=${m#github.com/leasehold/leasehold/}
  own=$(golineof "$m")
  need=$mingo
  by=root
  while read -r p v; do
    case "$p" in github.com/leasehold/leasehold*) g=$(golineof "$p") ;;
    *) g=$(sed -n 's/^go \([0-9.]*\).*/\1/p' "$real_cache/cache/download/$(escape "$p")/@v/$v.mod" 2>/dev/null || true) ;;
    esac
    [ -n "$g" ] || g=0
    if [ "$(printf '%s\n%s\n' "$need" "$g" | sort -V | tail -1)" != "$need" ]; then need=$g by="$p $v"; fi
  done < <(awk '/^require \($/ { r = 1; next } r && /^\)/ { r = 0; next } r { print $1, $2 } /^require [^(]/ { print $2, $3 }' "$d/go.mod")
  echo "  $d: go $own (needed: go $need, by $by)"
  if [ "$own" != "$need" ] && [ "$(printf '%s\n%s\n' "$own" "$need" | sort -V | tail -1)" = "$own" ]; then
    problem "$d/go.mod says go $own, but its requirements need only go $need: a user's go get would raise their go line for nothing"
  fi
done

echo "release-check: $(($(date +%s) - start)) s"
if [ $fail -ne 0 ]; then
  echo "release-check: FAIL" >&2
  exit 1
fi
echo "release-check: ok: $version installs and builds from a proxy, offline"
