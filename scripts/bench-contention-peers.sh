#!/bin/sh
# bench-contention-peers.sh ROOT DIR — builds DIR/child, a replica of the
# contention benchmark over the peer libraries bsm/redislock and
# go-redsync/redsync (Redis only), in a throw-away module in DIR, outside
# the repository: the peers are never added to leasehold's go.mod.
#   DIR/child redislock -store redis://... (Obtain, ExponentialBackoff 1 ms..16 ms)
#   DIR/child redsync   -store redis://... (default retry delay 50..250 ms, unlimited tries)
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
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

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

func main() {
	impl := os.Args[1]
	open := func(ctx context.Context, url string, ttl time.Duration) (*contention.Opened, error) {
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
go get github.com/bsm/redislock@v0.9.4 github.com/go-redsync/redsync/v4@v4.18.1 github.com/redis/go-redis/v9@v9.23.0 golang.org/x/sys@v0.49.0 >/dev/null 2>&1
go mod tidy >/dev/null 2>&1
go build -o child .
