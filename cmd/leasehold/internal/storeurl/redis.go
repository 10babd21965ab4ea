package storeurl

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/url"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/redisstore"
)

var errClientClosed = redis.ErrClosed

// openRedis parses a redis://, rediss:// or unix:// URL with go-redis, after
// taking out our own prefix parameter, and builds a single-node client, or a
// Cluster client when addr= parameters name more nodes.
func openRedis(_ context.Context, raw, desc string, c common) (*Opened, error) {
	u, err := parseURL(raw, desc)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	prefix := q.Get("prefix")
	if q.Has("prefix") && prefix == "" {
		return nil, fmt.Errorf("%w: %q: prefix= is empty; leave it out for the default %q", ErrBadURL, desc, redisstore.DefaultPrefix)
	}
	q.Del("prefix")
	u.RawQuery = q.Encode()
	if c.wantsTLS() && u.Scheme != "rediss" {
		return nil, fmt.Errorf("%w: %q: ca_file, cert_file, key_file and skip_verify need rediss:// (TLS)", ErrBadURL, desc)
	}

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
		if opts.TLSConfig, err = redisTLS(opts.TLSConfig, "", c); err != nil {
			return nil, fmt.Errorf("%w: %q: %v", ErrBadURL, desc, err)
		}
		client = redis.NewClusterClient(opts)
	} else {
		opts, err := redis.ParseURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("%w: %q: %v", ErrBadURL, desc, err)
		}
		opts.ContextTimeoutEnabled = honourDeadlines(q, opts.ContextTimeoutEnabled)
		if opts.TLSConfig, err = redisTLS(opts.TLSConfig, opts.Addr, c); err != nil {
			return nil, fmt.Errorf("%w: %q: %v", ErrBadURL, desc, err)
		}
		client = redis.NewClient(opts)
	}
	st, err := redisstore.New(client, redisstore.Options{Prefix: prefix})
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("%w: %q: %v", ErrBadURL, desc, err)
	}
	// The store before the client: the store's subscription uses the client.
	return &Opened{Store: st, Kind: Redis, Shared: true, closers: []io.Closer{st, client}, Warnings: c.warnings()}, nil
}

// redisTLS replaces go-redis's TLS configuration of a rediss:// URL (nil for
// redis://) with one built from the URL's TLS parameters. addr is the
// server's host:port, "" for a Cluster (each node's name is checked
// against its own address).
func redisTLS(parsed *tls.Config, addr string, c common) (*tls.Config, error) {
	if parsed == nil {
		return nil, nil
	}
	host := ""
	if addr != "" {
		host, _, _ = net.SplitHostPort(addr)
	}
	return c.tlsConfig(host)
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
