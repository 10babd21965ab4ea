package redisstore

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/driver"
)

// Defaults used for zero Options fields.
const (
	DefaultPrefix         = "leasehold:"
	DefaultFenceRetention = 24 * time.Hour
)

// ErrClosed is returned by WaitRelease after Close.
var ErrClosed = errors.New("redisstore: store closed")

var (
	//go:embed lib.lua
	libSrc string
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
	//go:embed refresh.lua
	refreshSrc string

	acquireScript      = script(acquireSrc)
	renewScript        = script(renewSrc)
	releaseScript      = script(releaseSrc)
	inspectScript      = script(inspectSrc)
	forceReleaseScript = script(forceReleaseSrc)
	refreshScript      = script(refreshSrc)
)

// script builds a script, with lib.lua's helpers where its "-- @lib" line
// stands: after a fast path that needs none of them, since every helper is
// a closure that each call would create.
func script(src string) *redis.Script {
	return redis.NewScript(strings.Replace(src, "-- @lib\n", libSrc, 1))
}

// Client is what a Store needs from go-redis. *redis.Client (single node or
// Sentinel failover), *redis.ClusterClient, *redis.Ring and every
// redis.UniversalClient satisfy it.
type Client interface {
	redis.Scripter
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
	Pipeline() redis.Pipeliner
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// clusterClient is what a Store uses of a *redis.ClusterClient: sharded
// pub/sub (SPUBLISH/SSUBSCRIBE) on the node that owns the key's slot.
type clusterClient interface {
	MasterForKey(ctx context.Context, key string) (*redis.Client, error)
}

var (
	_ Client        = (*redis.Client)(nil)
	_ Client        = (*redis.ClusterClient)(nil)
	_ Client        = (redis.UniversalClient)(nil)
	_ clusterClient = (*redis.ClusterClient)(nil)

	_ driver.Store          = (*Store)(nil)
	_ driver.Inspector      = (*Store)(nil)
	_ driver.Notifier       = (*Store)(nil)
	_ driver.LiveNotifier   = (*Store)(nil)
	_ driver.ForceReleaser  = (*Store)(nil)
	_ driver.BatchRenewer   = (*Store)(nil)
	_ driver.QueueRefresher = (*Store)(nil)
	_ driver.PresenceKeeper = (*Store)(nil)
)

// Options configure a Store. The zero value means the documented defaults.
type Options struct {
	// Prefix starts every Redis key and notification channel of this store.
	// Default "leasehold:". Give an ACL user `~PREFIX*` and `&PREFIX*` (see
	// README.md). A prefix whose first '{' is directly followed by '}'
	// is refused: Redis Cluster would then hash every name whole, and a
	// key's lock and fence would land in different slots.
	Prefix string

	// FenceRetention is how long a key's fence counter outlives the TTL of
	// the lock that last used it. After that Redis expires the counter and the
	// next fence comes from the server-time floor alone. Default 24 h; it
	// bounds how far back the Redis server's clock may step without fences
	// going backward.
	FenceRetention time.Duration

	// Functions calls the store's scripts with FCALL from the Redis
	// Functions library (Library) instead of EVALSHA/EVAL, so the service
	// user needs +fcall and no +eval (which would let it run any script).
	// An operator loads the library first (LoadFunctions, or `leasehold
	// setup redis`); until then every call fails with ErrMisconfigured.
	// Redis 7 or later.
	Functions bool
}

// Store is a driver.Store, Inspector, Notifier, BatchRenewer, QueueRefresher
// and ForceReleaser over Redis. It is safe for concurrent use. Close stops
// its notification subscriptions.
type Store struct {
	c         Client
	cluster   clusterClient // nil unless c is a Cluster client: sharded pub/sub
	sharded   string        // "1" with sharded pub/sub, for the scripts
	prefix    string
	retention time.Duration
	fcall     fcaller // nil unless Options.Functions
	wake      string  // this Store's waiter channel suffix (WaiterChannel), random hex
	presence  bool    // c is one node (or Sentinel's master), whose scripts can read PresenceKey

	notify notifier

	// evictedSeen is INFO's evicted_keys + 1 as last read (CheckConfig, a
	// lost renewal); 0 until read, and always 0 for a user without INFO.
	evictedSeen atomic.Int64
}

// New returns a Store over client. It does not contact Redis; the first
// call does. Close the Store before the client. When client has AddHook
// (every go-redis client does), New adds a hook that marks a failed TLS or
// protocol handshake of a new connection, so that the store never takes
// one for an outage (see README.md). A *redis.Client,
// *redis.ClusterClient or *redis.Ring must have ContextTimeoutEnabled (New
// returns an error wrapping driver.ErrInvalidOptions otherwise), so that
// the Locker's deadlines bound every call.
func New(client Client, opts Options) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: redisstore: client is nil", driver.ErrInvalidOptions)
	}
	if !honoursDeadlines(client) {
		return nil, fmt.Errorf("%w: redisstore: the go-redis client has ContextTimeoutEnabled false: set it to true, or the Locker's deadlines and renewal failure budget do not bound a call on a dead connection", driver.ErrInvalidOptions)
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if i := strings.IndexByte(opts.Prefix, '{'); i >= 0 && strings.HasPrefix(opts.Prefix[i+1:], "}") {
		return nil, fmt.Errorf("%w: redisstore: Prefix %q has an empty hash tag {}: a key's lock and fence would land in different Cluster slots", driver.ErrInvalidOptions, opts.Prefix)
	}
	switch {
	case opts.FenceRetention < 0:
		return nil, fmt.Errorf("%w: redisstore: FenceRetention must be >= 0, got %v", driver.ErrInvalidOptions, opts.FenceRetention)
	case opts.FenceRetention == 0:
		opts.FenceRetention = DefaultFenceRetention
	}
	var id [6]byte
	_, _ = rand.Read(id[:]) // crypto/rand.Read never fails
	s := &Store{c: client, sharded: "0", prefix: opts.Prefix, retention: opts.FenceRetention, wake: hex.EncodeToString(id[:])}
	if cc, ok := client.(clusterClient); ok {
		s.cluster, s.sharded = cc, "1"
	}
	_, s.presence = client.(*redis.Client)
	if opts.Functions {
		fc, ok := client.(fcaller)
		if !ok {
			return nil, fmt.Errorf("%w: redisstore: Functions needs a client with FCall, got %T", driver.ErrInvalidOptions, client)
		}
		s.fcall = fc
	}
	if h, ok := client.(interface{ AddHook(redis.Hook) }); ok {
		hook := &handshakeHook{}
		if rc, ok := client.(*redis.Client); ok {
			hook.probes, hook.tls = true, rc.Options().TLSConfig
		}
		h.AddHook(hook)
	}
	s.notify.init(s)
	return s, nil
}

// honoursDeadlines reports whether a go-redis client bounds each call by its
// context's deadline (ContextTimeoutEnabled). A client type it cannot look
// into (a wrapper) is taken to.
func honoursDeadlines(c Client) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return true
}

// tag returns the hash tag text of key: key with '%', '{' and '}' written as
// %25, %7B and %7D, so that no key can end or open the tag early.
func tag(key string) string {
	if !strings.ContainsAny(key, "%{}") {
		return key
	}
	return tagEscaper.Replace(key)
}

var (
	tagEscaper   = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")
	tagUnescaper = strings.NewReplacer("%25", "%", "%7B", "{", "%7D", "}")
)

// base returns PREFIX{TAG}, the start of every Redis name of key.
func (s *Store) base(key string) string { return s.prefix + "{" + tag(key) + "}" }

// LockKey returns the Redis key of key's lock: PREFIX{TAG}:lock, where TAG
// is key with '%', '{' and '}' escaped as %25, %7B and %7D (most keys are
// their own tag). Its value is "TOKEN|HOLDER" ("TOKEN" when the holder is
// empty); its PTTL the remaining TTL.
func (s *Store) LockKey(key string) string { return s.base(key) + ":lock" }

// FenceKey returns the Redis key of key's fence counter: PREFIX{TAG}:fence.
// It holds the last fence minted for key as a decimal number, which is the
// holder's fence while the lock exists.
func (s *Store) FenceKey(key string) string { return s.base(key) + ":fence" }

// QueueKey returns the Redis key of key's waiter queue: PREFIX{TAG}:queue, a
// hash of TOKEN -> "SEQ|DEADLINE_MS|TTL_MS|WAKE|HOLDER" (TTL_MS is the lock
// TTL the waiter asked for, which a release grants it, and WAKE the id of
// its process's WaiterChannel). Its order is PREFIX{TAG}:order, a sorted set
// of TOKEN scored by SEQ, so the scripts find the head without reading every
// entry. Both expire with their last live waiter.
func (s *Store) QueueKey(key string) string { return s.base(key) + ":queue" }

// Channel returns key's notification channel, PREFIX{TAG}:wake, which every
// waiter subscribes (besides its WaiterChannel): a release with nobody
// queued publishes "" there, waking every waiter, and a wake-up of a head
// queued by an older client (no WaiterChannel recorded) its token. Grants
// ("TOKEN|FENCE|TTL_MS") go to the head's WaiterChannel. It
// is a sharded channel (SPUBLISH/SSUBSCRIBE) on a Cluster.
func (s *Store) Channel(key string) string { return s.base(key) + ":wake" }

// WaiterChannel returns the channel on which this Store's waiters of key
// are woken and granted the key: PREFIX{TAG}:wake:ID, where ID is random per
// Store (per process). A waiting acquire records ID in its queue entry, and
// a release publishes the grant to the head's process alone, so the other
// processes that wait on the key are not woken by every hand-off.
func (s *Store) WaiterChannel(key string) string { return s.Channel(key) + ":" + s.wake }

// ObserverChannel returns key's channel for observers (WaitRelease with no
// token: election followers, `leasehold leader --watch`):
// PREFIX{TAG}:watch. Every grant or wake-up published to one process's
// WaiterChannel is published there too; observers also subscribe Channel,
// which carries the rest.
func (s *Store) ObserverChannel(key string) string { return s.base(key) + ":watch" }

func (s *Store) keys(key string) []string { return []string{s.LockKey(key), s.FenceKey(key)} }

func ttlMillis(ttl time.Duration) (int64, error) {
	ms := ttl.Milliseconds()
	if ms < 1 {
		return 0, fmt.Errorf("%w: redisstore: TTL must be at least 1ms, got %v", driver.ErrInvalidOptions, ttl)
	}
	return ms, nil
}

func checkKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: key is empty", driver.ErrInvalidKey)
	}
	return nil
}

// checkToken refuses tokens the lock value "TOKEN|HOLDER" cannot hold.
func checkToken(token string) error {
	if token == "" || strings.IndexByte(token, '|') >= 0 {
		return fmt.Errorf("%w: redisstore: a token must be non-empty and must not contain '|', got %q", driver.ErrInvalidOptions, token)
	}
	return nil
}

// Acquire implements driver.Store: one EVALSHA with the queue rule, SET
// NX PX of "TOKEN|HOLDER" and the fence, max(last+1, Redis TIME in µs).
func (s *Store) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := checkKey(req.Key); err != nil {
		return driver.Grant{}, err
	}
	if err := checkToken(req.Token); err != nil {
		return driver.Grant{}, err
	}
	ms, err := ttlMillis(req.TTL)
	if err != nil {
		return driver.Grant{}, err
	}
	var qms int64
	if req.QueueTTL > 0 {
		qms = max(req.QueueTTL.Milliseconds(), 1)
	}
	value := req.Token // the lock's value: "TOKEN|HOLDER", or "TOKEN" with no holder
	if req.Holder != "" {
		value += "|" + req.Holder
	}
	base := s.base(req.Key)
	res, err := s.run(ctx, acquireScript, []string{base + ":lock", base + ":fence", base + ":queue", base + ":order"},
		value, ms, fmt.Sprintf("%d|%d|%s|%d|%s", ms+s.retention.Milliseconds(), qms, s.wake, s.keptMillis(req.Kept), s.sharded)).Result()
	if err != nil {
		return driver.Grant{}, s.fail("acquire", req.Key, err)
	}
	return decodeGrant(res)
}

// decodeGrant decodes acquire.lua's reply: the fence on a grant, or
// {0, pttl, holder, ahead} on a refusal.
func decodeGrant(res any) (driver.Grant, error) {
	if _, ok := res.(string); ok {
		fence, err := parseFence(res)
		if err != nil {
			return driver.Grant{}, fmt.Errorf("redisstore: acquire: %w", err)
		}
		return driver.Grant{Fence: fence}, nil
	}
	r, _ := res.([]any)
	if len(r) != 4 {
		return driver.Grant{}, fmt.Errorf("redisstore: acquire: unexpected reply %v", res)
	}
	pttl, _ := r[1].(int64)
	holder, _ := r[2].(string)
	ahead, _ := r[3].(int64)
	return driver.Grant{
		Remaining: max(time.Duration(pttl)*time.Millisecond, 0),
		Holder:    holder,
		Ahead:     int(ahead),
	}, driver.ErrNotAcquired
}

func parseFence(v any) (uint64, error) {
	s, ok := v.(string)
	if !ok {
		return 0, fmt.Errorf("%w: fence reply %v (%T) is not a string", driver.ErrBadEntry, v, v)
	}
	f, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: fence %q is not a decimal uint64", driver.ErrBadEntry, truncate(s))
	}
	return f, nil
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// Renew implements driver.Store: compare-and-PEXPIRE.
func (s *Store) Renew(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := checkKey(key); err != nil {
		return err
	}
	ms, err := ttlMillis(ttl)
	if err != nil {
		return err
	}
	n, err := s.run(ctx, renewScript, s.keys(key), token, ms, ms+s.retention.Milliseconds()).Int64()
	switch {
	case err != nil:
		return s.fail("renew", key, err)
	case n != 1:
		return s.lost(ctx)
	}
	return nil
}

// RenewBatch implements driver.BatchRenewer: the renew script for every
// request in one pipeline (see runBatch).
func (s *Store) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []error {
	cmds, errs := s.runBatch(ctx, renewScript, len(reqs), func(i int) ([]string, []any, error) {
		r := reqs[i]
		if err := checkKey(r.Key); err != nil {
			return nil, nil, err
		}
		ms, err := ttlMillis(r.TTL)
		if err != nil {
			return nil, nil, err
		}
		return s.keys(r.Key), []any{r.Token, ms, ms + s.retention.Milliseconds()}, nil
	})
	var lost error
	for i, c := range cmds {
		if c == nil {
			continue
		}
		n, err := c.Int64()
		switch {
		case err != nil:
			errs[i] = s.fail("renew", reqs[i].Key, err)
		case n != 1:
			if lost == nil {
				lost = s.lost(ctx)
			}
			errs[i] = lost
		default:
			errs[i] = nil
		}
	}
	return errs
}

// RefreshQueue implements driver.QueueRefresher: the refresh script (TIME,
// then HGET, HSET, PEXPIRE GT of the queue and of its order, and EXISTS per
// place) in one pipeline (one round trip per node on a Cluster). On a single
// node (or Sentinel) one call refreshes up to refreshChunk places; on a
// Cluster or Ring, where the keys of one call must share a slot, each place
// is its own call.
func (s *Store) RefreshQueue(ctx context.Context, reqs []driver.QueueRefresh) []error {
	errs := make([]error, len(reqs))
	var ok []int // the requests sent
	for i, r := range reqs {
		if err := checkKey(r.Key); err != nil {
			errs[i] = err
			continue
		}
		if _, err := ttlMillis(r.QueueTTL); err != nil {
			errs[i] = err
			continue
		}
		ok = append(ok, i)
	}
	chunk := 1
	if _, single := s.c.(*redis.Client); single {
		chunk = refreshChunk
	}
	var calls [][]int
	for len(ok) > 0 { // one call per chunk of places with one queue TTL and Kept
		n, ttl, kept := 1, reqs[ok[0]].QueueTTL, reqs[ok[0]].Kept
		for n < min(chunk, len(ok)) && reqs[ok[n]].QueueTTL == ttl && reqs[ok[n]].Kept == kept {
			n++
		}
		calls, ok = append(calls, ok[:n]), ok[n:]
	}
	cmds, cerrs := s.runBatch(ctx, refreshScript, len(calls), func(c int) ([]string, []any, error) {
		keys := make([]string, 0, 3*len(calls[c]))
		r := reqs[calls[c][0]]
		args := []any{fmt.Sprintf("%d|%d", r.QueueTTL.Milliseconds(), s.keptMillis(r.Kept))}
		for _, i := range calls[c] {
			base := s.base(reqs[i].Key)
			keys = append(keys, base+":lock", base+":queue", base+":order")
			args = append(args, reqs[i].Token)
		}
		return keys, args, nil
	})
	for c, cmd := range cmds {
		codes, err := cmd.Int64Slice()
		if err == nil && len(codes) != len(calls[c]) {
			err = fmt.Errorf("%w: refresh of %d places returned %d codes", driver.ErrBadEntry, len(calls[c]), len(codes))
		}
		for j, i := range calls[c] {
			switch {
			case cerrs[c] != nil:
				errs[i] = cerrs[c]
			case err != nil:
				errs[i] = s.fail("refresh", reqs[i].Key, err)
			case codes[j] == 0:
				errs[i] = driver.ErrNotQueued
			case codes[j] == 2:
				errs[i] = driver.ErrNotHeld
			}
		}
	}
	return errs
}

// keptMillis returns Kept in ms for the scripts: 0 when this Store keeps no
// presence, so the place lives QueueTTL.
func (s *Store) keptMillis(kept time.Duration) int64 {
	if !s.presence || kept <= 0 {
		return 0
	}
	return max(kept.Milliseconds(), 1)
}

// PresenceKey returns the Redis key of this Store's presence:
// PREFIX + "present:" + the id of its WaiterChannel. While it exists, the
// queue places this Store's waiters queued with Kept live on (see
// QueueKey); KeepPresence sets it, and so does, for its QueueTTL, a
// waiting Acquire with Kept that finds it gone (Redis lost its data).
func (s *Store) PresenceKey() string { return s.prefix + "present:" + s.wake }

// KeepPresence implements driver.PresenceKeeper: SET PresenceKey NX PX ttl,
// then PEXPIRE GT, in one round trip. The scripts read the key without
// declaring it (it lies in another hash slot than the queue), so only a
// Store over one node keeps a presence: on a Cluster or Ring it returns an
// error wrapping errors.ErrUnsupported, and places live QueueTTL.
func (s *Store) KeepPresence(ctx context.Context, ttl time.Duration) error {
	if !s.presence {
		return fmt.Errorf("redisstore: a presence needs a client of one Redis node, got %T: %w", s.c, errors.ErrUnsupported)
	}
	ms, err := ttlMillis(ttl)
	if err != nil {
		return err
	}
	p := s.c.Pipeline()
	p.Do(ctx, "SET", s.PresenceKey(), "1", "NX", "PX", ms) // nil when it exists
	longer := p.Do(ctx, "PEXPIRE", s.PresenceKey(), ms, "GT")
	_, err = p.Exec(ctx)
	if errors.Is(err, redis.Nil) {
		err = longer.Err()
	}
	if err != nil {
		return s.fail("presence", "", err)
	}
	return nil
}

// refreshChunk is the most places one refresh call keeps (on a single
// node): about 1 ms of Redis's time, so that no call holds up the others.
const refreshChunk = 128

// runBatch sends sc for n requests in one pipeline (one round trip per node
// on a Cluster); args returns request i's keys and arguments, or the error
// that keeps it out. When Redis has lost the script cache (NOSCRIPT) the
// batch is sent again with EVAL, which needs no SCRIPT LOAD permission and
// caches the script again. It returns each request's command (nil when
// kept out) and its error (nil when sent).
func (s *Store) runBatch(ctx context.Context, sc *redis.Script, n int, args func(i int) ([]string, []any, error)) ([]*redis.Cmd, []error) {
	errs := make([]error, n)
	cmds := make([]*redis.Cmd, n)
	send := func(ctx context.Context, eval bool) {
		pipe := s.c.Pipeline()
		for i := range n {
			keys, argv, err := args(i)
			if err != nil {
				errs[i] = err
				continue
			}
			cmds[i] = s.runPiped(ctx, pipe, eval, sc, keys, argv...)
		}
		_, _ = pipe.Exec(ctx) // errors are read per command
	}
	send(ctx, false)
	for _, c := range cmds {
		if c != nil && c.Err() != nil && redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			rctx, cancel := reloadContext(ctx)
			send(rctx, true)
			cancel()
			break
		}
	}
	return cmds, errs
}

// Release implements driver.Store: compare-and-DEL, leaving the queue and
// handing the free key to its head, in one script. The head becomes the
// holder at once (its token and holder, PX = the TTL it asked for, capped
// at its queue deadline, and a fresh fence) and "TOKEN|FENCE|TTL_MS" is
// published on the key's channel: a subscribed waiter takes the lease from
// the message (a driver.Wake with the grant) without an acquire of its own, and one
// that missed it finds itself the holder on its next Acquire.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	base := s.base(key)
	n, err := s.run(ctx, releaseScript, []string{base + ":lock", base + ":queue", base + ":fence", base + ":released:" + token, base + ":order"},
		base+":wake", s.sharded, token, s.retention.Milliseconds(), releasedMemory.Milliseconds()).Int64()
	if err != nil {
		return s.fail("release", key, err)
	}
	switch {
	case n == 1:
		return nil
	case n == 2:
		return driver.ErrNotOwned
	}
	return driver.ErrNotHeld
}

// releasedMemory is how long PREFIX{TAG}:released:TOKEN remembers a
// release, so that a retry of that release (its reply lost, resent by
// go-redis) that finds the key taken answers nil, not ErrNotOwned: longer than
// a Locker's ReleaseTimeout (default 2 s) and go-redis's retries of one call.
const releasedMemory = 10 * time.Second

// ForceRelease implements driver.ForceReleaser: it deletes key's lock
// whoever holds it, wakes the head waiter and returns what it deleted. A
// fence key that holds no valid fence is deleted with it (the repair for
// ErrBadEntry on acquire); the returned error then wraps ErrBadEntry.
func (s *Store) ForceRelease(ctx context.Context, key string) (driver.LockInfo, error) {
	if err := checkKey(key); err != nil {
		return driver.LockInfo{}, err
	}
	base := s.base(key)
	res, err := s.run(ctx, forceReleaseScript, s.inspectKeys(key), base+":wake", s.sharded).Slice()
	switch {
	case errors.Is(err, redis.Nil):
		return driver.LockInfo{}, driver.ErrNotHeld
	case err != nil:
		return driver.LockInfo{}, s.fail("force release", key, err)
	}
	info, err := s.info(key, res)
	if repaired, _ := res[len(res)-1].(int64); repaired == 1 {
		info.Fence = 0
		err = fmt.Errorf("%w: %s held no usable fence and was deleted with the lock: the next fence comes from the Redis clock",
			driver.ErrBadEntry, s.FenceKey(key))
	}
	return info, err
}

// Inspect implements driver.Inspector. LockInfo.Facts names the Redis
// keys and channel (lock_key, fence_key, queue_key, channel) for a runbook.
func (s *Store) Inspect(ctx context.Context, key string) (driver.LockInfo, error) {
	if err := checkKey(key); err != nil {
		return driver.LockInfo{}, err
	}
	res, err := s.run(ctx, inspectScript, s.inspectKeys(key)).Slice()
	switch {
	case errors.Is(err, redis.Nil):
		return driver.LockInfo{}, driver.ErrNotHeld
	case err != nil:
		return driver.LockInfo{}, s.fail("inspect", key, err)
	}
	return s.info(key, res)
}

func (s *Store) inspectKeys(key string) []string {
	base := s.base(key)
	return []string{base + ":lock", base + ":fence", base + ":queue", base + ":order"}
}

// info decodes the {value, pttl, fence, waiting, next holder} reply of
// inspect.lua and forcerelease.lua. A fence that is not a decimal uint64 is
// reported with an error wrapping ErrBadEntry, along with the rest.
func (s *Store) info(key string, res []any) (driver.LockInfo, error) {
	if len(res) < 5 {
		return driver.LockInfo{}, fmt.Errorf("redisstore: %q: unexpected reply %v", key, res)
	}
	v, _ := res[0].(string)
	tok, holder, _ := strings.Cut(v, "|")
	pttl, _ := res[1].(int64)
	waiting, _ := res[3].(int64)
	next, _ := res[4].(string)
	info := driver.LockInfo{
		Key: key, Token: tok, Holder: holder, Remaining: max(time.Duration(pttl)*time.Millisecond, 0),
		Waiting: int(waiting), NextHolder: next,
		Facts: map[string]string{
			"store": "redis", "lock_key": s.LockKey(key), "fence_key": s.FenceKey(key),
			"queue_key": s.QueueKey(key), "channel": s.Channel(key),
		},
	}
	if pttl < 0 {
		return info, fmt.Errorf("%w: %s has no expiry (PTTL %d); delete it to free the key", driver.ErrBadEntry, s.LockKey(key), pttl)
	}
	if res[2] != nil {
		f, err := parseFence(res[2])
		if err != nil {
			return info, fmt.Errorf("%s: %w", s.FenceKey(key), err)
		}
		info.Fence = f
	}
	return info, nil
}
