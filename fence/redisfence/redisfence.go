package redisfence

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/fence"
)

var (
	//go:embed write.lua
	writeLua    string
	writeScript = redis.NewScript(writeLua)

	//go:embed read.lua
	readLua    string
	readScript = redis.NewScript(readLua)
)

// RedisOptions configure a Redis resource. The zero value is valid.
type RedisOptions struct {
	// Expiration, when > 0, is set on a key by every accepted write
	// (PEXPIRE), so keys of finished work do not pile up. A key that expires
	// forgets its fence: only use it when no holder can outlive it. Default 0:
	// keys never expire (an existing expiry is kept).
	Expiration time.Duration

	// Name is the locker name carried by events (Event.Locker), the metrics
	// label. Default "default".
	Name string
	// Resource names this resource in events and errors (Event.Op). Default
	// "redis".
	Resource string
	// Observer receives an EventStaleWrite for every rejected write. Default:
	// none.
	Observer leasehold.Observer
}

// Redis writes fenced values to Redis. Each key is a hash with fields value
// and fence (`redis-cli HGETALL key` shows both), written by one Lua script,
// so the check and the write are atomic and cost one round trip (EVALSHA,
// falling back to EVAL). Keys are used as given: with Redis Cluster each
// write touches one key, so any key works.
//
// A Redis is safe for concurrent use.
type Redis struct {
	c   redis.Scripter
	exp time.Duration
	rep fence.Reporter
}

var _ fence.Resource = (*Redis)(nil)

// NewRedis returns a Redis resource over c: a *redis.Client, *redis.Ring,
// *redis.ClusterClient, redis.UniversalClient or any redis.Scripter.
func NewRedis(c redis.Scripter, opts RedisOptions) (*Redis, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: redis client is nil", fence.ErrInvalidOptions)
	}
	if opts.Expiration < 0 {
		return nil, fmt.Errorf("%w: Expiration must be >= 0, got %v", fence.ErrInvalidOptions, opts.Expiration)
	}
	if opts.Expiration > 0 && opts.Expiration < time.Millisecond {
		return nil, fmt.Errorf("%w: Expiration must be at least 1ms, got %v", fence.ErrInvalidOptions, opts.Expiration)
	}
	return &Redis{c: c, exp: opts.Expiration, rep: fence.Reporter{Name: opts.Name, Resource: orDefault(opts.Resource, "redis"), Observer: opts.Observer}}, nil
}

// Write sets key's value and fence when fence >= the stored fence (or key
// does not exist), and otherwise returns a *StaleError (matching
// fence.ErrStaleFence) and changes nothing. Fence 0 is refused with fence.ErrNoFence.
func (r *Redis) Write(ctx context.Context, key string, token uint64, value []byte) error {
	if err := fence.CheckFence(token); err != nil {
		return err
	}
	res, err := writeScript.Run(ctx, r.c, []string{key}, strconv.FormatUint(token, 10), value, r.exp.Milliseconds()).Slice()
	if err != nil {
		return fmt.Errorf("fence: redis write %q: %w", key, err)
	}
	if len(res) != 2 {
		return fmt.Errorf("fence: redis write %q: unexpected reply %v", key, res)
	}
	if ok, _ := res[0].(int64); ok == 1 {
		return nil
	}
	s, _ := res[1].(string)
	current, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return fmt.Errorf("fence: redis write %q: stored fence %q is not a number: %w", key, s, err)
	}
	return r.rep.Stale(key, token, current)
}

// Read returns key's value and fence, or an error matching fence.ErrNotFound.
func (r *Redis) Read(ctx context.Context, key string) (value []byte, token uint64, err error) {
	res, err := readScript.Run(ctx, r.c, []string{key}).Slice()
	if err != nil {
		return nil, 0, fmt.Errorf("fence: redis read %q: %w", key, err)
	}
	if len(res) != 2 || res[0] == nil || res[1] == nil {
		return nil, 0, fmt.Errorf("%w: redis key %q", fence.ErrNotFound, key)
	}
	v, _ := res[0].(string)
	s, _ := res[1].(string)
	if token, err = strconv.ParseUint(s, 10, 64); err != nil {
		return nil, 0, fmt.Errorf("fence: redis read %q: stored fence %q is not a number: %w", key, s, err)
	}
	return []byte(v), token, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
