package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/waiters"
)

// Defaults used for zero Options fields.
const (
	DefaultPrefix         = "leasehold:"
	DefaultFenceRetention = 24 * time.Hour
)

// ErrClosed is returned by WaitRelease after Close.
var ErrClosed = errors.New("redisstore: store closed")

var (
	//go:embed acquire.lua
	acquireSrc string
	//go:embed renew.lua
	renewSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed inspect.lua
	inspectSrc string
	//go:embed forcerelease.lua
	forceReleaseSrc string

	acquireScript      = redis.NewScript(acquireSrc)
	renewScript        = redis.NewScript(renewSrc)
	releaseScript      = redis.NewScript(releaseSrc)
	inspectScript      = redis.NewScript(inspectSrc)
	forceReleaseScript = redis.NewScript(forceReleaseSrc)
)

// Client is what a Store needs from go-redis. *redis.Client (single node or
// Sentinel failover), *redis.ClusterClient, *redis.Ring and every
// redis.UniversalClient satisfy it.
type Client interface {
	redis.Scripter
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
	Pipeline() redis.Pipeliner
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

var (
	_ Client = (*redis.Client)(nil)
	_ Client = (*redis.ClusterClient)(nil)
	_ Client = (redis.UniversalClient)(nil)

	_ leasehold.Store         = (*Store)(nil)
	_ leasehold.Notifier      = (*Store)(nil)
	_ leasehold.ForceReleaser = (*Store)(nil)
	_ leasehold.BatchRenewer  = (*Store)(nil)
)

// Options configure a Store. The zero value means the documented defaults.
type Options struct {
	// Prefix starts every Redis key and the notification channel of this
	// store. Default "leasehold:". Give an ACL user `~PREFIX*` and
	// `&PREFIX*` (see the package doc).
	Prefix string

	// FenceRetention is how long a key's fence counter outlives the TTL of
	// the lock that last used it. After that Redis expires the counter and the
	// next fence comes from the server-time floor alone. Default 24 h; it
	// bounds how far back the Redis server's clock may step without fences
	// going backward.
	FenceRetention time.Duration
}

// Store is a leasehold.Store, Notifier and ForceReleaser over Redis. It is
// safe for concurrent use. Close stops its shared pub/sub subscription.
type Store struct {
	c         Client
	prefix    string
	channel   string
	retention time.Duration

	subMu   sync.Mutex
	sub     *subscription // nil until the first WaitRelease
	closed  bool
	waiters waiters.Set
}

// New returns a Store over client. It does not contact Redis; the first
// call does. Close the Store before the client.
func New(client Client, opts Options) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: redisstore: client is nil", leasehold.ErrInvalidOptions)
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	switch {
	case opts.FenceRetention < 0:
		return nil, fmt.Errorf("%w: redisstore: FenceRetention must be >= 0, got %v", leasehold.ErrInvalidOptions, opts.FenceRetention)
	case opts.FenceRetention == 0:
		opts.FenceRetention = DefaultFenceRetention
	}
	return &Store{
		c:         client,
		prefix:    opts.Prefix,
		channel:   opts.Prefix + "released",
		retention: opts.FenceRetention,
	}, nil
}

// LockKey returns the Redis key of key's lock: PREFIX{KEY}:lock. Its value is
// the owner token; its PTTL the remaining TTL.
func (s *Store) LockKey(key string) string { return s.prefix + "{" + key + "}:lock" }

// FenceKey returns the Redis key of key's fence counter: PREFIX{KEY}:fence. It
// holds the last fence minted for key, which is the holder's fence while the
// lock exists.
func (s *Store) FenceKey(key string) string { return s.prefix + "{" + key + "}:fence" }

// Channel returns the pub/sub channel on which releases publish the key.
func (s *Store) Channel() string { return s.channel }

func (s *Store) keys(key string) []string { return []string{s.LockKey(key), s.FenceKey(key)} }

func ttlMillis(ttl time.Duration) (int64, error) {
	ms := ttl.Milliseconds()
	if ms < 1 {
		return 0, fmt.Errorf("%w: redisstore: TTL must be at least 1ms, got %v", leasehold.ErrInvalidOptions, ttl)
	}
	return ms, nil
}

func checkKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: key is empty", leasehold.ErrInvalidKey)
	}
	return nil
}

func storeErr(op, key string, err error) error {
	return fmt.Errorf("redisstore: %s %q: %w", op, key, err)
}

// Acquire implements leasehold.Store: one EVALSHA that does SET NX PX and
// mints the fence, max(last+1, Redis TIME in µs).
func (s *Store) Acquire(ctx context.Context, req leasehold.AcquireRequest) (leasehold.Grant, error) {
	key, token, ttl := req.Key, req.Token, req.TTL
	if err := checkKey(key); err != nil {
		return leasehold.Grant{}, err
	}
	ms, err := ttlMillis(ttl)
	if err != nil {
		return leasehold.Grant{}, err
	}
	res, err := acquireScript.Run(ctx, s.c, s.keys(key), token, ms, ms+s.retention.Milliseconds()).Slice()
	if err != nil {
		return leasehold.Grant{}, storeErr("acquire", key, err)
	}
	if len(res) != 2 {
		return leasehold.Grant{}, storeErr("acquire", key, fmt.Errorf("unexpected reply %v", res))
	}
	if ok, _ := res[0].(int64); ok != 1 {
		pttl, _ := res[1].(int64)
		return leasehold.Grant{Remaining: max(time.Duration(pttl)*time.Millisecond, 0)}, leasehold.ErrNotAcquired
	}
	fence, err := parseFence(res[1])
	if err != nil {
		return leasehold.Grant{}, storeErr("acquire", key, err)
	}
	return leasehold.Grant{Fence: fence}, nil
}

func parseFence(v any) (uint64, error) {
	s, ok := v.(string)
	if !ok {
		return 0, fmt.Errorf("fence reply %v (%T) is not a string", v, v)
	}
	f, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("fence %q: %w", s, err)
	}
	return f, nil
}

// Renew implements leasehold.Store: compare-and-PEXPIRE.
func (s *Store) Renew(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := checkKey(key); err != nil {
		return err
	}
	ms, err := ttlMillis(ttl)
	if err != nil {
		return err
	}
	n, err := renewScript.Run(ctx, s.c, s.keys(key), token, ms, ms+s.retention.Milliseconds()).Int64()
	switch {
	case err != nil:
		return storeErr("renew", key, err)
	case n != 1:
		return leasehold.ErrNotOwned
	}
	return nil
}

// RenewBatch implements leasehold.BatchRenewer: the renew script for every
// request in one pipeline (one round trip per node on a Cluster). When Redis
// has lost the script cache (NOSCRIPT) the batch is sent again with EVAL,
// which needs no SCRIPT LOAD permission and caches the script again.
func (s *Store) RenewBatch(ctx context.Context, reqs []leasehold.RenewRequest) []error {
	errs := make([]error, len(reqs))
	cmds := make([]*redis.Cmd, len(reqs))
	send := func(eval bool) {
		pipe := s.c.Pipeline()
		for i, r := range reqs {
			if err := checkKey(r.Key); err != nil {
				errs[i] = err
				continue
			}
			ms, err := ttlMillis(r.TTL)
			if err != nil {
				errs[i] = err
				continue
			}
			args := []any{r.Token, ms, ms + s.retention.Milliseconds()}
			if eval {
				cmds[i] = renewScript.Eval(ctx, pipe, s.keys(r.Key), args...)
			} else {
				cmds[i] = renewScript.EvalSha(ctx, pipe, s.keys(r.Key), args...)
			}
		}
		_, _ = pipe.Exec(ctx) // errors are read per command below
	}
	send(false)
	for _, c := range cmds {
		if c != nil && c.Err() != nil && redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			send(true)
			break
		}
	}
	for i, c := range cmds {
		if c == nil {
			continue
		}
		n, err := c.Int64()
		switch {
		case err != nil:
			errs[i] = storeErr("renew", reqs[i].Key, err)
		case n != 1:
			errs[i] = leasehold.ErrNotOwned
		default:
			errs[i] = nil
		}
	}
	return errs
}

// Release implements leasehold.Store: compare-and-DEL, then PUBLISH key on
// Channel, in one script.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	n, err := releaseScript.Run(ctx, s.c, []string{s.LockKey(key)}, token, s.channel, key).Int64()
	switch {
	case err != nil:
		return storeErr("release", key, err)
	case n != 1:
		return leasehold.ErrNotOwned
	}
	return nil
}

// ForceRelease implements leasehold.ForceReleaser: it deletes key's lock
// whoever holds it, wakes waiters and returns what it deleted.
func (s *Store) ForceRelease(ctx context.Context, key string) (leasehold.LockInfo, error) {
	if err := checkKey(key); err != nil {
		return leasehold.LockInfo{}, err
	}
	res, err := forceReleaseScript.Run(ctx, s.c, s.keys(key), s.channel, key).Slice()
	switch {
	case errors.Is(err, redis.Nil):
		return leasehold.LockInfo{}, leasehold.ErrNotHeld
	case err != nil:
		return leasehold.LockInfo{}, storeErr("force release", key, err)
	}
	info, err := s.info(key, res)
	if err != nil {
		return leasehold.LockInfo{}, storeErr("force release", key, err)
	}
	return info, nil
}

// Inspect implements leasehold.Store. LockInfo.Facts names the Redis keys and
// channel (lock_key, fence_key, channel) for a runbook.
func (s *Store) Inspect(ctx context.Context, key string) (leasehold.LockInfo, error) {
	if err := checkKey(key); err != nil {
		return leasehold.LockInfo{}, err
	}
	res, err := inspectScript.Run(ctx, s.c, s.keys(key)).Slice()
	switch {
	case errors.Is(err, redis.Nil):
		return leasehold.LockInfo{}, leasehold.ErrNotHeld
	case err != nil:
		return leasehold.LockInfo{}, storeErr("inspect", key, err)
	}
	info, err := s.info(key, res)
	if err != nil {
		return leasehold.LockInfo{}, storeErr("inspect", key, err)
	}
	return info, nil
}

// info decodes the {token, pttl, fence} reply of inspect.lua.
func (s *Store) info(key string, res []any) (leasehold.LockInfo, error) {
	if len(res) < 2 {
		return leasehold.LockInfo{}, fmt.Errorf("unexpected reply %v", res)
	}
	tok, _ := res[0].(string)
	pttl, _ := res[1].(int64)
	info := leasehold.LockInfo{
		Key: key, Token: tok, Remaining: max(time.Duration(pttl)*time.Millisecond, 0),
		Facts: map[string]string{
			"store": "redis", "lock_key": s.LockKey(key), "fence_key": s.FenceKey(key), "channel": s.channel,
		},
	}
	if len(res) > 2 && res[2] != nil {
		f, err := parseFence(res[2])
		if err != nil {
			return leasehold.LockInfo{}, err
		}
		info.Fence = f
	}
	return info, nil
}

// List implements leasehold.Store with SCAN MATCH over the store's key space;
// on a Cluster it scans every master. It is an operator's tool: its cost
// grows with the number of keys in Redis, not only with the locks.
func (s *Store) List(ctx context.Context, prefix string) ([]leasehold.LockInfo, error) {
	var (
		mu  sync.Mutex
		out []leasehold.LockInfo
	)
	scan := func(ctx context.Context, c Client) error {
		found, err := s.scan(ctx, c, prefix)
		mu.Lock()
		out = append(out, found...)
		mu.Unlock()
		return err
	}
	var err error
	switch c := s.c.(type) {
	case interface {
		ForEachMaster(context.Context, func(context.Context, *redis.Client) error) error
	}:
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return scan(ctx, m) })
	case interface {
		ForEachShard(context.Context, func(context.Context, *redis.Client) error) error
	}:
		err = c.ForEachShard(ctx, func(ctx context.Context, m *redis.Client) error { return scan(ctx, m) })
	default:
		err = scan(ctx, s.c)
	}
	if err != nil {
		return nil, storeErr("list", prefix, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// scan lists the locks on one node: SCAN in batches, each batch read with one
// pipeline of inspect scripts.
func (s *Store) scan(ctx context.Context, c Client, prefix string) ([]leasehold.LockInfo, error) {
	match := globEscape(s.prefix) + "{" + globEscape(prefix) + "*}:lock"
	var (
		out    []leasehold.LockInfo
		cursor uint64
	)
	for {
		names, next, err := c.Scan(ctx, cursor, match, 1000).Result()
		if err != nil {
			return out, err
		}
		if len(names) > 0 {
			found, err := s.inspectAll(ctx, c, names)
			if err != nil {
				return out, err
			}
			out = append(out, found...)
		}
		if cursor = next; cursor == 0 {
			return out, nil
		}
	}
}

func (s *Store) inspectAll(ctx context.Context, c Client, names []string) ([]leasehold.LockInfo, error) {
	keys := make([]string, 0, len(names))
	for _, n := range names {
		if k, ok := s.userKey(n); ok {
			keys = append(keys, k)
		}
	}
	pipe := c.Pipeline()
	cmds := make([]*redis.Cmd, len(keys))
	for i, k := range keys {
		cmds[i] = inspectScript.Eval(ctx, pipe, s.keys(k))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	out := make([]leasehold.LockInfo, 0, len(keys))
	for i, cmd := range cmds {
		res, err := cmd.Slice()
		if errors.Is(err, redis.Nil) {
			continue // released or expired since SCAN saw it
		}
		if err != nil {
			return nil, err
		}
		info, err := s.info(keys[i], res)
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

// userKey turns PREFIX{KEY}:lock back into KEY.
func (s *Store) userKey(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, s.prefix+"{")
	if !ok {
		return "", false
	}
	return strings.CutSuffix(rest, "}:lock")
}

// globEscape escapes the characters special to SCAN MATCH.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
