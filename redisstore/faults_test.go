package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// TestFencesSurviveRestart restarts Redis without persistence, which loses
// every lock and fence counter: every new fence must still be greater than
// every fence handed out before.
func TestFencesSurviveRestart(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.Client(t)
	s := newStore(t, c, redisstore.Options{})
	ctx := t.Context()

	var highest uint64
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprintf("restart:%d", i)
	}
	// Many acquisitions of one key in a burst, so its counter runs ahead of
	// the time floor, plus one acquisition of each other key.
	for i := range 300 {
		g, err := s.Acquire(ctx, driver.AcquireRequest{Key: keys[0], Token: "t", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if g.Fence <= highest {
			t.Fatalf("burst %d: expected fence > %d, got %d", i, highest, g.Fence)
		}
		highest = g.Fence
		if err := s.Release(ctx, keys[0], "t"); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range keys[1:] {
		g, err := s.Acquire(ctx, driver.AcquireRequest{Key: k, Token: "held", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		highest = max(highest, g.Fence)
	}

	srv.Restart()

	for _, k := range keys {
		if n, err := c.Exists(ctx, s.FenceKey(k), s.LockKey(k)).Result(); err != nil || n != 0 {
			t.Fatalf("after restart: expected the lock and fence keys of %q gone, got %d, %v", k, n, err)
		}
	}
	for _, k := range keys {
		g, err := s.Acquire(ctx, driver.AcquireRequest{Key: k, Token: "after", TTL: time.Minute})
		if err != nil {
			t.Fatalf("Acquire(%q) after restart: %v", k, err)
		}
		if g.Fence <= highest {
			t.Fatalf("Acquire(%q) after restart: expected fence > %d (highest before), got %d", k, highest, g.Fence)
		}
	}
}

// TestFenceCounterExpires checks that a key's fence counter does not pile
// up: it expires FenceRetention after the lock's TTL, and the next fence
// still goes up (time floor).
func TestFenceCounterExpires(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.Client(t)
	s := newStore(t, c, redisstore.Options{FenceRetention: 100 * time.Millisecond})
	ctx := t.Context()
	g1, err := s.Acquire(ctx, driver.AcquireRequest{Key: "gc", Token: "a", TTL: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pttl, err := c.PTTL(ctx, s.FenceKey("gc")).Result()
	if err != nil || pttl <= 0 || pttl > 200*time.Millisecond {
		t.Fatalf("fence key PTTL: expected in (0, 200ms], got %v, %v", pttl, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := c.Exists(ctx, s.FenceKey("gc"), s.LockKey("gc")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("lock and fence keys still exist 5s after a 100ms TTL + 100ms retention")
		}
		time.Sleep(20 * time.Millisecond)
	}
	g2, err := s.Acquire(ctx, driver.AcquireRequest{Key: "gc", Token: "b", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if g2.Fence <= g1.Fence {
		t.Fatalf("after the counter expired: expected fence > %d, got %d", g1.Fence, g2.Fence)
	}
	// Renew keeps the counter alive as long as the lock.
	if err := s.Renew(ctx, "gc", "b", time.Hour); err != nil {
		t.Fatal(err)
	}
	if pttl, err := c.PTTL(ctx, s.FenceKey("gc")).Result(); err != nil || pttl < time.Hour {
		t.Fatalf("fence key PTTL after Renew(1h): expected >= 1h, got %v, %v", pttl, err)
	}
}

// TestKilledWhileHeld kills redis-server while a Locker holds a lease with a
// short TTL: renewal fails and the lease's context ends, abandoned or
// expired, no later than the TTL after the kill.
func TestKilledWhileHeld(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.Client(t)
	s := newStore(t, c, redisstore.Options{})
	const ttl = 600 * time.Millisecond
	lk, err := leasehold.New(s, leasehold.Options{
		Name: "killed", TTL: ttl, RenewInterval: 150 * time.Millisecond,
		RenewTimeout: 100 * time.Millisecond, MaxRenewFailures: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	lease, err := lk.TryAcquire(t.Context(), "killed")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // one renewal has gone through
	if lease.Err() != nil {
		t.Fatalf("lease ended before the kill: %v", lease.Err())
	}
	killed := time.Now()
	srv.Stop()
	select {
	case <-lease.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("lease still trusted 5s after redis-server was killed")
	}
	after := time.Since(killed)
	cause := lease.Err()
	t.Logf("lease ended %v after the kill with cause %v", after, cause)
	if !errors.Is(cause, leasehold.ErrLeaseAbandoned) && !errors.Is(cause, leasehold.ErrLeaseExpired) {
		t.Fatalf("expected cause ErrLeaseAbandoned or ErrLeaseExpired, got %v", cause)
	}
	// The holder's own deadline is at most TTL after the last successful
	// renewal, which was before the kill. 250 ms of scheduling slack.
	if after > ttl+250*time.Millisecond {
		t.Fatalf("lease ended %v after the kill, expected within the TTL (%v) + slack", after, ttl)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatalf("Release of an abandoned lease: expected a no-op, got %v", err)
	}
}

// TestStoreErrorsWrapRedis checks that a failing Redis yields an error that
// wraps the go-redis error and is not contention.
func TestStoreErrorsWrapRedis(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.Client(t)
	s := newStore(t, c, redisstore.Options{})
	if err := c.Set(t.Context(), s.LockKey("wrongtype"), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// A fence key holding garbage makes the script fail.
	if err := c.HSet(t.Context(), s.FenceKey("wrongtype"), "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	_, err := s.Acquire(t.Context(), driver.AcquireRequest{Key: "wrongtype", Token: "x", TTL: time.Second})
	var rerr redis.Error
	if err == nil || !errors.As(err, &rerr) || errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("expected a wrapped redis.Error, got %v", err)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := redisstore.New(nil, redisstore.Options{}); !errors.Is(err, leasehold.ErrInvalidOptions) {
		t.Fatalf("nil client: expected ErrInvalidOptions, got %v", err)
	}
	c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := redisstore.New(c, redisstore.Options{FenceRetention: -1}); !errors.Is(err, leasehold.ErrInvalidOptions) {
		t.Fatalf("negative FenceRetention: expected ErrInvalidOptions, got %v", err)
	}
	s, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.LockKey("job:1"); got != "leasehold:{job:1}:lock" {
		t.Fatalf("LockKey: expected leasehold:{job:1}:lock, got %s", got)
	}
	if _, err := s.Acquire(t.Context(), driver.AcquireRequest{Key: "k", Token: "t", TTL: 0}); !errors.Is(err, leasehold.ErrInvalidOptions) {
		t.Fatalf("TTL 0: expected ErrInvalidOptions, got %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.WaitRelease(t.Context(), "k", "w"); !errors.Is(err, redisstore.ErrClosed) {
		t.Fatalf("WaitRelease after Close: expected ErrClosed, got %v", err)
	}
}

// TestNotificationsResumeAfterRestart checks that the notification
// connection reconnects after redis-server restarts: the reconnect itself
// wakes every waiter (a release may have been missed meanwhile), and
// releases wake waiters again afterwards.
func TestNotificationsResumeAfterRestart(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.Client(t)
	s := newStore(t, c, redisstore.Options{})
	ctx := t.Context()
	ch, stop, err := s.WaitRelease(ctx, "resub", "w")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	other, stopOther, err := s.WaitRelease(ctx, "resub-other", "w2")
	if err != nil {
		t.Fatal(err)
	}
	defer stopOther()
	<-ch // the wake-ups at once (see driver.Notifier)
	<-other
	srv.Restart()
	for i, c := range []<-chan driver.Wake{ch, other} {
		select {
		case <-c:
		case <-time.After(15 * time.Second):
			t.Fatalf("waiter %d: not woken within 15s of the reconnect after a restart", i)
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; ; i++ {
		tok := fmt.Sprint("t", i)
		if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "resub", Token: tok, TTL: time.Minute}); err == nil {
			_ = s.Release(ctx, "resub", tok)
		}
		select {
		case <-ch:
			t.Logf("notified after restart on release %d", i)
			return
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no release notification within 15s after a restart: the subscription did not come back")
		}
	}
}

// A batch renewal after Redis lost its script cache (SCRIPT FLUSH, a restart
// or failover) falls back to EVAL and still renews every lock.
func TestRenewBatchAfterScriptFlush(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.Client(t)
	s := newStore(t, c, redisstore.Options{})
	ctx := t.Context()
	reqs := make([]driver.RenewRequest, 5)
	for i := range reqs {
		key := "flush:" + string(rune('a'+i))
		if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "me", TTL: time.Second}); err != nil {
			t.Fatal(err)
		}
		reqs[i] = driver.RenewRequest{Key: key, Token: "me", TTL: time.Minute}
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for i, err := range s.RenewBatch(ctx, reqs) {
		if err != nil {
			t.Fatalf("request %d: expected a renewal after SCRIPT FLUSH, got %v", i, err)
		}
	}
	for _, r := range reqs {
		if info, err := s.Inspect(ctx, r.Key); err != nil || info.Remaining < 30*time.Second {
			t.Fatalf("%s: expected > 30s left after the batch, got %v, %v", r.Key, info.Remaining, err)
		}
	}
}
