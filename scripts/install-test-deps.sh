#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine: redis-server,
# PostgreSQL (initdb, pg_ctl, pg_basebackup, psql), iproute2 (ip netns), etcd (the drill's etcd mode and the cmd
# module's tests start the etcd binary), promtool (Debian's prometheus
# package), etcd VERSION for etcdstore (below) and staticcheck. Idempotent: it installs only what is missing. Needs root (or
# sudo) for apt-get.
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  need+=(postgresql)
fi
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# ip: the partition tests build network namespaces (internal/netns).
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v jq >/dev/null 2>&1 || need+=(jq)

if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "install-test-deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian starts services after install; the tests start their own.
  $SUDO service redis-server stop >/dev/null 2>&1 || true
  $SUDO service postgresql stop >/dev/null 2>&1 || true
  $SUDO service prometheus stop >/dev/null 2>&1 || true
  $SUDO service etcd stop >/dev/null 2>&1 || true
fi

# etcdstore's tests run an etcd server of the version of the etcd client
# they link (etcdstore/internal/testetcd), not Debian's 3.4: built once from
# the Go module proxy as $(go env GOPATH)/bin/etcd-VERSION. (`go install
# …@version` refuses etcd's server module: its go.mod has replace
# directives; a throwaway module that requires it builds it.)
root=$(cd "$(dirname "$0")/.." && pwd)
etcdv=$(awk '$1 == "go.etcd.io/etcd/client/v3" { print $2 }' "$root/etcdstore/go.mod")
etcdbin=$(go env GOPATH)/bin/etcd-$etcdv
if [ -n "$etcdv" ] && [ ! -x "$etcdbin" ]; then
  echo "install-test-deps: building etcd $etcdv as $etcdbin"
  tmp=$(mktemp -d)
  printf 'module leasehold.invalid/etcdbuild\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$etcdv" >"$tmp/go.mod"
  mkdir -p "$(dirname "$etcdbin")"
  (cd "$tmp" && GOWORK=off GOFLAGS=-mod=mod go build -trimpath -o "$etcdbin" go.etcd.io/etcd/server/v3)
  rm -rf "$tmp"
fi
