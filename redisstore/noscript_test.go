package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// slowLink delays every reply by d, after Redis answered: a link whose round
// trip is longer than a call's deadline.
type slowLink struct{ d time.Duration }

func (h slowLink) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h slowLink) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		time.Sleep(h.d)
		return err
	}
}
func (h slowLink) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		time.Sleep(h.d)
		return err
	}
}

// #27 (5): after Redis lost its script cache, a renewal whose deadline is
// shorter than two round trips (a short TTL's RenewTimeout over a slow link)
// used up its deadline on the EVALSHA that answered NOSCRIPT and skipped the
// EVAL, so no renewal ever loaded the script again and every lease was
// abandoned. The EVAL must go out anyway, so the renewals come back.
func TestRenewalsReloadTheScriptPastTheirDeadline(t *testing.T) {
	srv := testredis.Start(t)
	direct := srv.Client(t)
	c := newClient(t, srv.Addr)
	c.AddHook(slowLink{d: 60 * time.Millisecond})
	s := newStore(t, c, redisstore.Options{})
	ctx := t.Context()
	keys := []string{"slow:a", "slow:b"}
	for _, k := range keys {
		if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: k, Token: "me", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	renew := map[string]func(ctx context.Context) error{
		"Renew": func(ctx context.Context) error { return s.Renew(ctx, keys[0], "me", time.Minute) },
		"RenewBatch": func(ctx context.Context) error {
			for _, err := range s.RenewBatch(ctx, []driver.RenewRequest{{Key: keys[0], Token: "me", TTL: time.Minute}, {Key: keys[1], Token: "me", TTL: time.Minute}}) {
				if err != nil {
					return err
				}
			}
			return nil
		},
	}
	for name, call := range renew {
		if err := direct.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		var last error
		for range 3 {
			rctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
			last = call(rctx)
			cancel()
		}
		if last != nil {
			t.Fatalf("%s: expected the renewals to come back once the script was loaded again, got %v on the third", name, last)
		}
	}
}
