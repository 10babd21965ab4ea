#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine: redis-server,
# PostgreSQL (initdb, pg_ctl, pg_basebackup), iproute2 (ip netns), etcd (the drill's etcd mode and the cmd
# module's tests start the etcd binary), promtool (Debian's prometheus
# package) and staticcheck. Idempotent: it installs only what is missing. Needs root (or
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
