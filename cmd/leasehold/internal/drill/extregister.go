package drill

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
	"github.com/leasehold/leasehold/fence/pgfence"
	"github.com/leasehold/leasehold/fence/redisfence"
)

// externalTimeout bounds one call to an external register. No fault is ever
// injected between the drill and its register, so this only trips when the
// register itself is sick.
const externalTimeout = 5 * time.Second

// fencedResource is what package fence's Redis and PostgreSQL resources have
// in common.
type fencedResource interface {
	Write(ctx context.Context, key string, fence uint64, value []byte) error
	Read(ctx context.Context, key string) ([]byte, uint64, error)
}

// externalRegister adapts a fence resource in a real Redis or PostgreSQL to
// the drill's register. The drill's faults never touch it: it is the
// storage at the write boundary, not the lock store.
type externalRegister struct {
	res   fencedResource
	close func()
}

func (e *externalRegister) Write(ctx context.Context, key string, f uint64, value []byte) error {
	ctx, cancel := context.WithTimeout(ctx, externalTimeout)
	defer cancel()
	return e.res.Write(ctx, key, f, value)
}

func (e *externalRegister) Read(key string) ([]byte, uint64, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), externalTimeout)
	defer cancel()
	v, f, err := e.res.Read(ctx, key)
	if err != nil { // ErrNotFound, or a sick register: the job is not done
		return nil, 0, false
	}
	return v, f, true
}

// checkRegister validates Config.Register without connecting.
func checkRegister(url string) error {
	switch {
	case url == "" || url == "memory":
		return nil
	case strings.HasPrefix(url, "redis://") || strings.HasPrefix(url, "rediss://"):
		if _, err := redis.ParseURL(url); err != nil {
			return fmt.Errorf("%w: --register: %s", ErrInvalidConfig, storeurl.RedactError(err, url))
		}
		return nil
	case strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://"):
		if _, err := pgxpool.ParseConfig(url); err != nil {
			return fmt.Errorf("%w: --register: %s", ErrInvalidConfig, storeurl.RedactError(err, url))
		}
		return nil
	}
	return fmt.Errorf("%w: --register must be memory, redis://HOST:PORT[/DB] or postgres://…, got %q", ErrInvalidConfig, storeurl.Describe(url))
}

// openRegister connects the register named by url, with keys (Redis) or a
// table (PostgreSQL) of this run only, removed again by close.
func openRegister(ctx context.Context, url string, obs leasehold.Observer) (*externalRegister, error) {
	run := runID()
	ctx, cancel := context.WithTimeout(ctx, externalTimeout)
	defer cancel()
	if strings.HasPrefix(url, "redis") {
		opts, err := redis.ParseURL(url)
		if err != nil {
			return nil, fmt.Errorf("%w: --register: %s", ErrInvalidConfig, storeurl.RedactError(err, url))
		}
		c := redis.NewClient(opts)
		if err := c.Ping(ctx).Err(); err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("%w: register at %s: %s", ErrSetup, storeurl.Describe(url), storeurl.RedactError(err, url))
		}
		res, err := redisfence.NewRedis(c, redisfence.RedisOptions{Name: "drill", Resource: "register", Observer: obs})
		if err != nil {
			_ = c.Close()
			return nil, err
		}
		prefix := "leasehold-drill-register:" + run + ":"
		return &externalRegister{res: prefixed{res, prefix}, close: func() {
			deleteKeys(c, prefix, externalTimeout)
			_ = c.Close()
		}}, nil
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("%w: --register: %s", ErrInvalidConfig, storeurl.RedactError(err, url))
	}
	table := "leasehold_drill_register_" + run
	ident := pgx.Identifier{table}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+ident+" (id text PRIMARY KEY, data bytea, fence bigint NOT NULL DEFAULT 0)"); err != nil {
		pool.Close()
		return nil, fmt.Errorf("%w: register at %s: %s", ErrSetup, storeurl.Describe(url), storeurl.RedactError(err, url))
	}
	drop := func() {
		cctx, ccancel := context.WithTimeout(context.Background(), externalTimeout)
		defer ccancel()
		_, _ = pool.Exec(cctx, "DROP TABLE IF EXISTS "+ident)
		pool.Close()
	}
	res, err := pgfence.NewTable(pool, pgfence.TableOptions{Table: table, Name: "drill", Resource: "register", Observer: obs})
	if err != nil {
		drop()
		return nil, err
	}
	return &externalRegister{res: res, close: drop}, nil
}

// prefixed puts a run's keys under a prefix of their own.
type prefixed struct {
	fencedResource
	prefix string
}

func (p prefixed) Write(ctx context.Context, key string, f uint64, value []byte) error {
	return p.fencedResource.Write(ctx, p.prefix+key, f, value)
}

func (p prefixed) Read(ctx context.Context, key string) ([]byte, uint64, error) {
	return p.fencedResource.Read(ctx, p.prefix+key)
}
