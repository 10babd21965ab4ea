#!/bin/sh
# bench-contention-peers.sh ROOT DIR — builds DIR/child, a replica of the
# contention benchmark over the peer libraries bsm/redislock and
# go-redsync/redsync (Redis), etcd's concurrency.Mutex and PostgreSQL
# session advisory locks, in a throw-away module in DIR, outside the
# repository: the peers are never added to leasehold's go.mod.
#   DIR/child redislock -store redis://... (Obtain, ExponentialBackoff 1 ms..16 ms)
#   DIR/child redsync   -store redis://... (default retry delay 50..250 ms, unlimited tries)
#   DIR/child etcdmutex -store etcd://HOST:PORT (concurrency.Mutex on one Session per replica)
#   DIR/child advisory  -store postgres://... (pg_advisory_lock / pg_advisory_unlock, one connection)
# The replica loop is ROOT's cmd/leasehold/internal/contention/child.go.
set -eu
root=$1
dir=$2
mkdir -p "$dir/contention"
cp "$root/cmd/leasehold/internal/contention/child.go" "$dir/contention/"
cat >"$dir/main.go" <<'GO'
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"peers/contention"
)

type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

type redislockLock struct {
	c   *redislock.Client
	ttl time.Duration
}

func (l redislockLock) Acquire(ctx context.Context, key string) (func(context.Context) error, error) {
	lk, err := l.c.Obtain(ctx, key, l.ttl, &redislock.Options{RetryStrategy: redislock.ExponentialBackoff(time.Millisecond, 16*time.Millisecond)})
	if err != nil {
		return nil, err
	}
	return lk.Release, nil
}

type redsyncLock struct {
	rs  *redsync.Redsync
	ttl time.Duration
}

func (l redsyncLock) Acquire(ctx context.Context, key string) (func(context.Context) error, error) {
	m := l.rs.NewMutex(key, redsync.WithExpiry(l.ttl), redsync.WithTries(1<<30))
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { _, err := m.UnlockContext(ctx); return err }, nil
}

// etcdMutex is etcd's own concurrency.Mutex on one Session (one lease for
// the replica, kept alive by the client; TTL rounded up to whole seconds).
type etcdMutex struct{ s *concurrency.Session }

func (l etcdMutex) Acquire(ctx context.Context, key string) (func(context.Context) error, error) {
	m := concurrency.NewMutex(l.s, "/mutex/"+key)
	if err := m.Lock(ctx); err != nil {
		return nil, err
	}
	return m.Unlock, nil
}

// advisory is a PostgreSQL session-level advisory lock on the replica's one
// connection: pg_advisory_lock blocks in the server until it is granted.
type advisory struct{ c *pgx.Conn }

func (l advisory) Acquire(ctx context.Context, key string) (func(context.Context) error, error) {
	if _, err := l.c.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", key); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		_, err := l.c.Exec(ctx, "SELECT pg_advisory_unlock(hashtext($1))", key)
		return err
	}, nil
}

// openPeer opens the etcd and PostgreSQL peers; their requests are counted
// on the server.
func openPeer(ctx context.Context, impl, url string, ttl time.Duration) (*contention.Opened, error) {
	switch impl {
	case "etcdmutex":
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{strings.TrimPrefix(url, "etcd://")}, DialTimeout: 5 * time.Second})
		if err != nil {
			return nil, err
		}
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(int((ttl+time.Second-1)/time.Second)))
		if err != nil {
			cli.Close()
			return nil, err
		}
		return &contention.Opened{Lock: etcdMutex{s}, Close: func() { s.Close(); cli.Close() }}, nil
	case "advisory":
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			return nil, err
		}
		return &contention.Opened{Lock: advisory{c}, Close: func() { c.Close(context.Background()) }}, nil
	}
	return nil, fmt.Errorf("unknown peer %q", impl)
}

func main() {
	impl := os.Args[1]
	open := func(ctx context.Context, url string, ttl time.Duration) (*contention.Opened, error) {
		if impl == "etcdmutex" || impl == "advisory" {
			return openPeer(ctx, impl, url, ttl)
		}
		opts, err := redis.ParseURL(url)
		if err != nil {
			return nil, err
		}
		client := redis.NewClient(opts)
		n := new(atomic.Int64)
		client.AddHook(countHook{n})
		o := &contention.Opened{Requests: n.Load, Close: func() { _ = client.Close() }}
		switch impl {
		case "redislock":
			o.Lock = redislockLock{redislock.New(client), ttl}
		case "redsync":
			o.Lock = redsyncLock{redsync.New(goredis.NewPool(client)), ttl}
		default:
			return nil, fmt.Errorf("unknown peer %q", impl)
		}
		return o, nil
	}
	os.Exit(contention.ChildMain(os.Args[2:], open, os.Stdin, os.Stdout))
}
GO
cd "$dir"
[ -f go.mod ] || go mod init peers >/dev/null 2>&1
go get github.com/bsm/redislock@v0.9.4 github.com/go-redsync/redsync/v4@v4.18.1 github.com/redis/go-redis/v9@v9.23.0 golang.org/x/sys@v0.49.0 \
	go.etcd.io/etcd/client/v3@v3.7.3 github.com/jackc/pgx/v5@v5.12.0 >/dev/null 2>&1
go mod tidy >/dev/null 2>&1
go build -o child .
