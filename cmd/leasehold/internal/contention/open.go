package contention

// This file adapts leasehold to Lock. scripts/bench-contention.sh copies it
// into a checkout of an older commit with the storeurl import rewritten.

import (
	"context"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/redisstore"
)

type leaseholdLock struct{ l *leasehold.Locker }

func (k leaseholdLock) Acquire(ctx context.Context, key string) (func(context.Context) error, error) {
	lease, err := k.l.Acquire(ctx, key)
	if err != nil {
		return nil, err
	}
	return lease.Release, nil
}

// countHook counts the round trips a go-redis client makes: one per command
// and one per pipeline.
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// OpenLeasehold opens a leasehold Locker over the store at raw. Redis gets
// its own go-redis client with a counting hook; other stores are opened as
// the CLI opens them and counted on the server.
func OpenLeasehold(ctx context.Context, raw string, ttl time.Duration) (*Opened, error) {
	var (
		st       driver.Store
		closers  []func() error
		requests func() int64
	)
	if strings.HasPrefix(raw, "redis://") {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, err
		}
		opts, err := redis.ParseURL(u.String())
		if err != nil {
			return nil, err
		}
		opts.ContextTimeoutEnabled = true
		client := redis.NewClient(opts)
		n := new(atomic.Int64)
		client.AddHook(countHook{n})
		rs, err := redisstore.New(client, redisstore.Options{})
		if err != nil {
			_ = client.Close()
			return nil, err
		}
		st, requests = rs, n.Load
		closers = []func() error{rs.Close, client.Close}
	} else {
		o, err := storeurl.Open(ctx, raw)
		if err != nil {
			return nil, err
		}
		st, closers = o.Store, []func() error{o.Close}
	}
	l, err := leasehold.New(st, leasehold.Options{Name: "bench-contention", TTL: ttl})
	if err != nil {
		for _, c := range closers {
			_ = c()
		}
		return nil, err
	}
	return &Opened{Lock: leaseholdLock{l}, Requests: requests, Close: func() {
		_ = l.Close()
		for _, c := range closers {
			_ = c()
		}
	}}, nil
}
