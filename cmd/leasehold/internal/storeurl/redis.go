package storeurl

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/redisstore"
)

var errClientClosed = redis.ErrClosed

// redisURL is a parsed redis://, rediss:// or unix:// URL.
type redisURL struct {
	client    redis.UniversalClient
	prefix    string
	functions bool
}

// openRedis parses a redis://, rediss:// or unix:// URL with go-redis, after
// taking out our own parameters (prefix, functions), and builds a
// single-node client, or a Cluster client when addr= parameters name more
// nodes.
func openRedis(_ context.Context, raw, desc string, c common) (*Opened, error) {
	r, err := parseRedis(raw, desc, c)
	if err != nil {
		return nil, err
	}
	st, err := redisstore.New(r.client, redisstore.Options{Prefix: r.prefix, Functions: r.functions})
	if err != nil {
		_ = r.client.Close()
		return nil, fmt.Errorf("%w: %q: %v", ErrBadURL, desc, err)
	}
	// The store before the client: the store's subscription uses the client.
	return &Opened{Store: st, Kind: Redis, Shared: true, closers: []io.Closer{st, r.client}, Warnings: c.warnings()}, nil
}

func parseRedis(raw, desc string, c common) (*redisURL, error) {
	u, err := parseURL(raw, desc)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	r := &redisURL{prefix: q.Get("prefix")}
	if q.Has("prefix") && r.prefix == "" {
		return nil, fmt.Errorf("%w: %q: prefix= is empty; leave it out for the default %q", ErrBadURL, desc, redisstore.DefaultPrefix)
	}
	if err := checkPrefix(r.prefix, desc); err != nil {
		return nil, err
	}
	if q.Has("functions") {
		if r.functions, err = strconv.ParseBool(q.Get("functions")); err != nil {
			return nil, fmt.Errorf("%w: %q: functions=%q: want true or false", ErrBadURL, desc, q.Get("functions"))
		}
	}
	q.Del("prefix")
	q.Del("functions")
	u.RawQuery = q.Encode()
	if c.wantsTLS() && u.Scheme != "rediss" {
		return nil, fmt.Errorf("%w: %q: ca_file, cert_file, key_file and skip_verify need rediss:// (TLS)", ErrBadURL, desc)
	}
	if q.Has("addr") && u.Scheme == "unix" {
		return nil, fmt.Errorf("%w: %q: addr= (Cluster) does not work with unix sockets", ErrBadURL, desc)
	}
	if r.client, err = redisClient(u, q, c); err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrBadURL, desc, err)
	}
	return r, nil
}

func redisClient(u *url.URL, q url.Values, c common) (redis.UniversalClient, error) {
	if q.Has("master_name") {
		return sentinelClient(u, q, c)
	}
	if q.Has("addr") {
		opts, err := redis.ParseClusterURL(u.String())
		if err != nil {
			return nil, err
		}
		opts.ContextTimeoutEnabled = honourDeadlines(q, opts.ContextTimeoutEnabled)
		if opts.TLSConfig, err = redisTLS(opts.TLSConfig, "", c); err != nil {
			return nil, err
		}
		return redis.NewClusterClient(opts), nil
	}
	opts, err := redis.ParseURL(u.String())
	if err != nil {
		return nil, err
	}
	opts.ContextTimeoutEnabled = honourDeadlines(q, opts.ContextTimeoutEnabled)
	if opts.TLSConfig, err = redisTLS(opts.TLSConfig, opts.Addr, c); err != nil {
		return nil, err
	}
	return redis.NewClient(opts), nil
}

// sentinelClient builds a failover client (go-redis ParseFailoverURL): the
// host and every addr= name sentinels, master_name= the master they
// monitor. The URL's user and password authenticate to the sentinels and,
// unless username= or password= say otherwise, to the master and replicas.
func sentinelClient(u *url.URL, q url.Values, c common) (redis.UniversalClient, error) {
	if q.Get("master_name") == "" {
		return nil, fmt.Errorf("master_name= is empty: name the master the sentinels monitor")
	}
	opts, err := redis.ParseFailoverURL(u.String())
	if err != nil {
		return nil, err
	}
	if !q.Has("username") && !q.Has("password") {
		opts.Username, opts.Password = opts.SentinelUsername, opts.SentinelPassword
	}
	opts.ContextTimeoutEnabled = honourDeadlines(q, opts.ContextTimeoutEnabled)
	if opts.TLSConfig, err = redisTLS(opts.TLSConfig, "", c); err != nil {
		return nil, err
	}
	// Leave a sentinel that stops answering (partitioned) instead of asking
	// it for the master until the pool gives up (docs/failover.md).
	if !q.Has("max_retries") && !q.Has("read_timeout") && !q.Has("dial_timeout") {
		redisstore.TuneFailover(opts)
	}
	return redis.NewFailoverClient(opts), nil
}

// LoadRedisFunctions loads redisstore's Functions library (FUNCTION LOAD
// REPLACE) into the Redis server of the URL raw, on every primary of a
// Cluster. The URL's user must be allowed FUNCTION (an operator, not the
// service). Errors wrap ErrBadURL, leasehold.ErrMisconfigured (the server
// refused: no permission for FUNCTION, a wrong password) or ErrUnavailable,
// and never contain the password.
func LoadRedisFunctions(ctx context.Context, raw string, getenv func(string) string) (desc string, err error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	raw = strings.TrimSpace(raw)
	secrets := secretsOf(raw)
	desc = Describe(raw)
	defer func() { err = redact(err, secrets, desc) }()
	scheme, _, _ := strings.Cut(raw, "://")
	if s := strings.ToLower(scheme); s != "redis" && s != "rediss" && s != "unix" {
		return desc, fmt.Errorf("%w: %q: want a redis://, rediss:// or unix:// URL", ErrBadURL, desc)
	}
	raw, c, err := prepare(raw, desc, &secrets, getenv)
	if err != nil {
		return desc, err
	}
	r, err := parseRedis(raw, desc, c)
	if err != nil {
		return desc, err
	}
	defer r.client.Close()
	if cc, ok := r.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			return redisstore.LoadFunctions(ctx, n)
		})
	} else {
		err = redisstore.LoadFunctions(ctx, r.client)
	}
	switch {
	case errors.Is(err, leasehold.ErrMisconfigured):
		return desc, fmt.Errorf("%s: %w", desc, err)
	case err != nil:
		return desc, fmt.Errorf("%w: %s: FUNCTION LOAD: %w", ErrUnavailable, desc, err)
	}
	return desc, nil
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
