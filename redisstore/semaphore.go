package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/driver"
)

// The semaphore scripts: one per operation, each the shared prelude
// (semaphore_lib.lua) followed by its own body.
var (
	//go:embed semaphore_lib.lua
	semLibSrc string
	//go:embed semaphore_acquire.lua
	semAcquireSrc string
	//go:embed semaphore_renew.lua
	semRenewSrc string
	//go:embed semaphore_release.lua
	semReleaseSrc string
	//go:embed semaphore_permits.lua
	semPermitsSrc string

	semAcquireScript = redis.NewScript(semLibSrc + semAcquireSrc)
	semRenewScript   = redis.NewScript(semLibSrc + semRenewSrc)
	semReleaseScript = redis.NewScript(semLibSrc + semReleaseSrc)
	semPermitsScript = redis.NewScript(semLibSrc + semPermitsSrc)
)

var (
	_ driver.Semaphorer     = (*Store)(nil)
	_ driver.PermitNotifier = (*Store)(nil)
)

// SemaphoreKeys returns the Redis keys of key's semaphore, all in key's hash
// slot (PREFIX{TAG}:sem:..., TAG as in LockKey): holders (ZSET token ->
// expiry in ms of server time), info (HASH token -> "fence|identity"), meta
// (HASH: fence, the last fence minted; limit, the last limit seen), queue
// (LIST of waiting tokens) and waiters (HASH token -> "queue deadline
// ms|identity").
func (s *Store) SemaphoreKeys(key string) []string {
	p := s.base(key) + ":sem:"
	return []string{p + "holders", p + "info", p + "meta", p + "queue", p + "waiters"}
}

// PermitChannel returns key's permit notification channel,
// PREFIX{TAG}:sem:wake (sharded pub/sub on a Cluster). A permit release
// publishes on it the token of each waiter whose turn came (the first F live
// waiters, F the permits free afterwards), and so does a waiter among those
// F leaving the queue; with an empty queue a freed permit publishes "",
// which wakes every subscriber of key.
func (s *Store) PermitChannel(key string) string { return s.base(key) + ":sem:wake" }

// permitWaiterKey names key's permit waiters in the notifier's waiter set;
// no lock key has a control character, so it never names a lock's waiters.
func permitWaiterKey(key string) string { return "\x00permit:" + key }

// WaitPermit implements driver.PermitNotifier on the store's notifier (see
// WaitRelease): it subscribes PermitChannel(key) and returns once Redis
// confirmed it, bounded by ctx. The channel receives a value when a release
// names token (see PermitChannel) and after every reconnect. Expiry sends
// nothing: a waiter wakes at the Remaining its AcquirePermit reported.
func (s *Store) WaitPermit(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	if err := checkKey(key); err != nil {
		return nil, nil, err
	}
	return s.subscribe(ctx, "subscribe permits", key, []string{s.PermitChannel(key)}, permitWaiterKey(key), token, nil)
}

// AcquirePermit implements driver.Semaphorer: one EVALSHA prunes expired
// holders and waiters, applies the queue rule and mints the fence,
// max(last+1, Redis TIME in µs).
func (s *Store) AcquirePermit(ctx context.Context, req driver.PermitRequest) (driver.Grant, error) {
	if err := checkKey(req.Key); err != nil {
		return driver.Grant{}, err
	}
	ms, err := ttlMillis(req.TTL)
	if err != nil {
		return driver.Grant{}, err
	}
	if req.Limit < 1 {
		return driver.Grant{}, fmt.Errorf("%w: redisstore: permit limit must be at least 1, got %d", driver.ErrInvalidOptions, req.Limit)
	}
	qms := max(req.QueueTTL.Milliseconds(), 0)
	if req.QueueTTL > 0 {
		qms = max(qms, 1)
	}
	res, err := s.run(ctx, semAcquireScript, s.SemaphoreKeys(req.Key),
		req.Token, ms, req.Limit, qms, req.Holder, s.retention.Milliseconds()).Slice()
	if err != nil {
		return driver.Grant{}, s.fail("acquire permit", req.Key, err)
	}
	if len(res) == 2 {
		if ok, _ := res[0].(int64); ok == 1 {
			fence, err := parseFence(res[1])
			if err != nil {
				return driver.Grant{}, s.fail("acquire permit", req.Key, err)
			}
			return driver.Grant{Fence: fence}, nil
		}
	}
	if len(res) != 4 {
		return driver.Grant{}, s.fail("acquire permit", req.Key, fmt.Errorf("unexpected reply %v", res))
	}
	rem, _ := res[1].(int64)
	ahead, _ := res[2].(int64)
	who, _ := res[3].(string)
	return driver.Grant{
		Remaining: max(time.Duration(rem)*time.Millisecond, 0), Ahead: int(ahead), Holder: who,
	}, driver.ErrNotAcquired
}

// RenewPermit implements driver.Semaphorer.
func (s *Store) RenewPermit(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := checkKey(key); err != nil {
		return err
	}
	ms, err := ttlMillis(ttl)
	if err != nil {
		return err
	}
	n, err := s.run(ctx, semRenewScript, s.SemaphoreKeys(key), token, ms, s.retention.Milliseconds()).Int64()
	switch {
	case err != nil:
		return s.fail("renew permit", key, err)
	case n != 1:
		return driver.ErrNotOwned
	}
	return nil
}

// ReleasePermit implements driver.Semaphorer: it frees the permit, leaves
// the queue and PUBLISHes the waiters whose turn came on PermitChannel, in
// one script.
func (s *Store) ReleasePermit(ctx context.Context, key, token string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	n, err := s.run(ctx, semReleaseScript, s.SemaphoreKeys(key), token, s.PermitChannel(key), s.sharded).Int64()
	switch {
	case err != nil:
		return s.fail("release permit", key, err)
	case n != 1:
		return driver.ErrNotHeld
	}
	return nil
}

// Permits implements driver.Semaphorer.
func (s *Store) Permits(ctx context.Context, key string) (driver.PermitInfo, error) {
	if err := checkKey(key); err != nil {
		return driver.PermitInfo{}, err
	}
	res, err := s.run(ctx, semPermitsScript, s.SemaphoreKeys(key)).Slice()
	if err != nil {
		return driver.PermitInfo{}, s.fail("permits", key, err)
	}
	info, err := s.permitInfo(key, res)
	if err != nil {
		return driver.PermitInfo{}, s.fail("permits", key, err)
	}
	return info, nil
}

// permitInfo decodes semaphore_permits.lua's reply.
func (s *Store) permitInfo(key string, res []any) (driver.PermitInfo, error) {
	if len(res) < 3 || (len(res)-3)%3 != 0 {
		return driver.PermitInfo{}, fmt.Errorf("unexpected reply %v", res)
	}
	limit, _ := res[0].(int64)
	waiting, _ := res[1].(int64)
	head, _ := res[2].(string)
	info := driver.PermitInfo{Key: key, Limit: int(limit), Waiting: int(waiting), NextHolder: head}
	keys := s.SemaphoreKeys(key)
	for i := 3; i < len(res); i += 3 {
		tok, _ := res[i].(string)
		rem, _ := res[i+1].(int64)
		v, _ := res[i+2].(string)
		fence, who, _ := strings.Cut(v, "|")
		f, err := parseFence(fence)
		if err != nil {
			return driver.PermitInfo{}, fmt.Errorf("%w: permit %q: %w", driver.ErrBadEntry, tok, err)
		}
		info.Holders = append(info.Holders, driver.LockInfo{
			Key: key, Token: tok, Holder: who, Fence: f, Remaining: max(time.Duration(rem)*time.Millisecond, 0),
			Facts: map[string]string{"store": "redis", "holders_key": keys[0], "info_key": keys[1], "channel": s.PermitChannel(key)},
		})
	}
	sort.Slice(info.Holders, func(i, j int) bool { return info.Holders[i].Fence < info.Holders[j].Fence })
	return info, nil
}
