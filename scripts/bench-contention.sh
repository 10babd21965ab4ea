#!/usr/bin/env bash
# bench-contention.sh — the cross-process contention benchmark of issue 11
# (BENCHMARKS.md, "Contention across processes").
#
# Starts redis-server, an etcd binary (Debian etcd-server) and PostgreSQL 15
# (with pg_stat_statements) on free loopback ports in a temporary
# directory, builds this tree's leasehold binary ("after") and a replica
# binary of BEFORE (default f7c9a25, the round-1 code) from a temporary git
# worktree with this tree's replica loop copied in ("before"), optionally
# the peers (PEERS=1: bsm/redislock and go-redsync in a throw-away module
# outside the repository, Redis only), then runs
#   leasehold bench --contention --replicas 8 --processes ...
# with every variant interleaved. Extra arguments go to leasehold bench
# (e.g. --passes 5 --cell 3s --takeovers 5 --json). STORES="redis" runs
# Redis only. A BEFORE that has cmd/leasehold/internal/contention (main since
# round 2) runs its own `leasehold bench-child`; BEFORE=none runs this tree
# alone. Many Lockers on few keys (issue 33): e.g. STORES=redis PEERS=1
# BEFORE=none ... --replicas 20 --lockers 10 --keys 10 --takeovers 0.
#
# Needs: go, git, redis-server, etcd, /usr/lib/postgresql/*/bin (see
# scripts/install-test-deps.sh). Run from anywhere inside the repository.
set -euo pipefail

root=$(git rev-parse --show-toplevel)
before=${BEFORE:-f7c9a25}
pgbin=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
tmp=$(mktemp -d /tmp/leasehold-contention.XXXXXX)
pids=""
cleanup() {
	for p in $pids; do kill "$p" 2>/dev/null || true; done
	if [ -f "$tmp/pg/postmaster.pid" ]; then
		aspg "$pgbin/pg_ctl" -D "$tmp/pg" -m immediate stop >/dev/null 2>&1 || true
	fi
	git -C "$root" worktree remove --force "$tmp/before" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

# freeport prints a loopback port nobody listens on.
freeport() {
	local p
	while :; do
		p=$((20000 + RANDOM % 40000))
		(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
	done
}
# aspg runs a PostgreSQL program as the postgres user when we are root
# (PostgreSQL refuses to run as root).
aspg() {
	if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# Builds.
echo "building after ($(git -C "$root" rev-parse --short HEAD)) and before ($before)" >&2
(cd "$root/cmd/leasehold" && go build -o "$tmp/leasehold" .)
if [ "$before" = none ]; then
	set -- --variant "after=$tmp/leasehold bench-child" "$@"
else
git -C "$root" worktree add --detach "$tmp/before" "$before" >/dev/null 2>&1
if [ -f "$tmp/before/cmd/leasehold/internal/contention/child.go" ]; then
	# BEFORE has the benchmark itself (main since round 2): its own replica.
	(cd "$tmp/before/cmd/leasehold" && go build -o "$tmp/leasehold-before" .)
	printf '#!/bin/sh\nexec "%s" bench-child "$@"\n' "$tmp/leasehold-before" >"$tmp/child-before"
	chmod +x "$tmp/child-before"
else
mkdir -p "$tmp/before/internal/contention" "$tmp/before/cmd/contention-child"
cp "$root/cmd/leasehold/internal/contention/child.go" "$tmp/before/internal/contention/"
sed 's#github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl#github.com/leasehold/leasehold/storeurl#' \
	"$root/cmd/leasehold/internal/contention/open.go" >"$tmp/before/internal/contention/open.go"
cat >"$tmp/before/cmd/contention-child/main.go" <<'GO'
package main

import (
	"os"

	"github.com/leasehold/leasehold/internal/contention"
)

func main() { os.Exit(contention.ChildMain(os.Args[1:], contention.OpenLeasehold, os.Stdin, os.Stdout)) }
GO
(cd "$tmp/before" && go build -o "$tmp/child-before" ./cmd/contention-child)
fi
set -- --variant "before=$tmp/child-before" --variant "after=$tmp/leasehold bench-child" "$@"
fi
if [ "${PEERS:-0}" = 1 ]; then
	"$root/scripts/bench-contention-peers.sh" "$root" "$tmp/peers"
	set -- "$@" --variant "redislock@redis=$tmp/peers/child redislock" --variant "redsync@redis=$tmp/peers/child redsync" \
		--variant "etcdmutex@etcd=$tmp/peers/child etcdmutex" --variant "advisory@postgres=$tmp/peers/child advisory"
fi

# Servers (STORES="redis" runs Redis only; default all three).
stores=${STORES:-redis etcd postgres}
has() { case " $stores " in *" $1 "*) return 0 ;; esac; return 1; }
rport=$(freeport)
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >"$tmp/redis.log" 2>&1 &
pids="$pids $!"
eport=$(freeport)
epeer=$(freeport)
pport=$(freeport)
set -- --redis "redis://127.0.0.1:$rport" "$@"
if has etcd; then
set -- --etcd "etcd://127.0.0.1:$eport" --etcd-metrics "http://127.0.0.1:$eport/metrics" "$@"
etcd --name b --data-dir "$tmp/etcd" \
	--listen-client-urls "http://127.0.0.1:$eport" --advertise-client-urls "http://127.0.0.1:$eport" \
	--listen-peer-urls "http://127.0.0.1:$epeer" --initial-advertise-peer-urls "http://127.0.0.1:$epeer" \
	--initial-cluster "b=http://127.0.0.1:$epeer" --heartbeat-interval 10 --election-timeout 100 \
	--log-level error >"$tmp/etcd.log" 2>&1 &
pids="$pids $!"
fi
if has postgres; then
set -- --postgres "postgres://postgres@127.0.0.1:$pport/postgres?sslmode=disable" "$@"
mkdir -p "$tmp/pg"
[ "$(id -u)" -ne 0 ] || chown postgres "$tmp" "$tmp/pg"
aspg "$pgbin/initdb" -D "$tmp/pg" -U postgres --auth=trust --no-sync >/dev/null
aspg "$pgbin/pg_ctl" -D "$tmp/pg" -l "$tmp/pg.log" -w -o \
	"-p $pport -c listen_addresses=127.0.0.1 -c unix_socket_directories=$tmp -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c shared_preload_libraries=pg_stat_statements" \
	start >/dev/null
fi
for _ in $(seq 50); do
	redis-cli -p "$rport" ping >/dev/null 2>&1 &&
		{ ! has etcd || ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$eport" endpoint health >/dev/null 2>&1; } && break
	sleep 0.2
done

echo "load before the run: $(uptime)" >&2
"$tmp/leasehold" bench --contention --replicas 8 --processes "$@"
echo "load after the run: $(uptime)" >&2
