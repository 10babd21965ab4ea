package storeurl

import (
	"context"
	"fmt"
	"io"
	"net/url"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/redisstore"
)

var errClientClosed = redis.ErrClosed

// openRedis parses a redis://, rediss:// or unix:// URL with go-redis, after
// taking out our own prefix parameter, and builds a single-node client, or a
// Cluster client when addr= parameters name more nodes.
func openRedis(_ context.Context, raw, desc string) (*Opened, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %s", ErrBadURL, desc, parseErr(err))
	}
	q := u.Query()
	prefix := q.Get("prefix")
	if q.Has("prefix") && prefix == "" {
		return nil, fmt.Errorf("%w: %q: prefix= is empty; leave it out for the default %q", ErrBadURL, desc, redisstore.DefaultPrefix)
	}
	q.Del("prefix")
	u.RawQuery = q.Encode()

	var client redis.UniversalClient
	if q.Has("addr") {
		if u.Scheme == "unix" {
			return nil, fmt.Errorf("%w: %q: addr= (Cluster) does not work with unix sockets", ErrBadURL, desc)
		}
		opts, err := redis.ParseClusterURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("%w: %q: %v", ErrBadURL, desc, err)
		}
		opts.ContextTimeoutEnabled = honourDeadlines(q, opts.ContextTimeoutEnabled)
		client = redis.NewClusterClient(opts)
	} else {
		opts, err := redis.ParseURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("%w: %q: %v", ErrBadURL, desc, err)
		}
		opts.ContextTimeoutEnabled = honourDeadlines(q, opts.ContextTimeoutEnabled)
		client = redis.NewClient(opts)
	}
	st, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("%w: %q: %v", ErrBadURL, desc, err)
	}
	// The store before the client: the store's subscription uses the client.
	return &Opened{Store: st, Kind: Redis, Shared: true, closers: []io.Closer{st, client}}, nil
}

// honourDeadlines turns on go-redis's ContextTimeoutEnabled unless the URL
// set context_timeout_enabled itself: a renewal bounded by its context must
// not wait for the client's ReadTimeout on a dead connection.
func honourDeadlines(q url.Values, parsed bool) bool {
	if q.Has("context_timeout_enabled") {
		return parsed
	}
	return true
}
