package storeurl

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasehold/leasehold/pgstore"
)

// Client returns the client an opened Redis or etcd store uses (a
// redis.UniversalClient or a *clientv3.Client), for read-only checks of
// the server (leasehold doctor), or nil for other stores. It is closed with
// o.
func (o *Opened) Client() any {
	for _, c := range o.closers {
		switch c := c.(type) {
		case redis.UniversalClient, *clientv3.Client:
			return c
		case interface{ Client() *clientv3.Client }: // an etcdstore.Store that dialled its own client
			return c.Client()
		}
	}
	return nil
}

// IsPostgres reports whether raw is a postgres:// or postgresql:// URL.
func IsPostgres(raw string) bool {
	scheme, _, _ := strings.Cut(strings.TrimSpace(raw), "://")
	s := strings.ToLower(scheme)
	return s == "postgres" || s == "postgresql"
}

// PostgresPool connects to the database of a postgres:// URL with the
// settings Open uses (password_file, the TLS parameters), without creating
// or changing the store's objects, for read-only checks (leasehold
// doctor). It returns the pool, the store's options from the URL (table,
// schema) and the URL with its password redacted. Close the pool when
// done. Errors wrap ErrBadURL or ErrUnavailable and contain no password.
func PostgresPool(ctx context.Context, raw string, getenv func(string) string) (*pgxpool.Pool, pgstore.Options, string, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	raw = strings.TrimSpace(raw)
	secrets := secretsOf(raw)
	desc := Describe(raw)
	cfg, opts, err := postgresConfig(raw, desc, &secrets, getenv)
	if err != nil {
		return nil, opts, desc, redact(err, secrets)
	}
	cctx, cancel := context.WithTimeout(ctx, pgConnectTimeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(cctx, cfg)
	if err == nil {
		if err = pool.Ping(cctx); err != nil {
			pool.Close()
		}
	}
	if err != nil {
		return nil, opts, desc, redact(fmt.Errorf("%w: %s: %w", ErrUnavailable, desc, err), secrets)
	}
	return pool, opts, desc, nil
}
