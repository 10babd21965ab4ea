package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// splitClient sends commands straight to Redis and subscribes through
// subs, so that a test can freeze the pub/sub connection alone.
type splitClient struct {
	*redis.Client
	subs *redis.Client
}

func (c splitClient) Subscribe(ctx context.Context, channels ...string) *redis.PubSub {
	return c.subs.Subscribe(ctx, channels...)
}

// TestFrozenSubscription freezes an established pub/sub connection (a hung
// server, a half-open TCP connection, a stuck proxy: Redis answers nothing
// on it, and nothing closes it). WaitRelease gives up waiting for the
// confirmation with an outage while the caller's context is still alive, so
// a Locker's waiter polls and gets the key once its holder releases. Once
// the connection delivers again, the late confirmations leave the key's
// channels usable: a new waiter subscribes and a release wakes it.
func TestFrozenSubscription(t *testing.T) {
	srv := testredis.Start(t)
	p := testredis.StartProxy(t, srv.Addr)
	s := newStore(t, splitClient{newClient(t, srv.Addr), newClient(t, p.Addr)}, redisstore.Options{})
	s.SetConfirmTimeout(200 * time.Millisecond)
	// Generous: the old code waited for the confirmation until it ended.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	// The pub/sub connection is dialled and subscribed before the freeze.
	_, stop, err := s.WaitRelease(ctx, "warm", "w0")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	p.Pause()
	for i := range 2 { // the second one finds the first one's subscription still pending
		_, _, err = s.WaitRelease(ctx, "frozen", "w1")
		if !errors.Is(err, driver.ErrUnavailable) || ctx.Err() != nil {
			t.Fatalf("WaitRelease %d on a frozen connection: expected an error wrapping ErrUnavailable before the caller's deadline, got %v (caller's context: %v)", i, err, ctx.Err())
		}
	}

	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "frozen", Token: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	lk, err := leasehold.New(s, leasehold.Options{Name: "frozen"})
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	got := make(chan error, 1)
	go func() {
		l, err := lk.Acquire(ctx, "frozen")
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	for {
		info, err := s.Inspect(ctx, "frozen")
		if err != nil {
			t.Fatal(err)
		}
		if info.Waiting > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Release(ctx, "frozen", "holder"); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("Locker.Acquire behind a frozen pub/sub connection: expected the key once its holder released, got %v", err)
	}

	p.Resume()
	wokenByRelease(ctx, t, s, "frozen", "w2", "the connection delivered again")
}

// wokenByRelease subscribes token to key (free) on s, after when, and
// expects the wake-up at once of a new subscription, then one for a
// release of key.
func wokenByRelease(ctx context.Context, t *testing.T, s *redisstore.Store, key, token, when string) {
	t.Helper()
	wake, stop, err := s.WaitRelease(ctx, key, token)
	if err != nil {
		t.Fatalf("WaitRelease after %s: %v", when, err)
	}
	defer stop()
	select { // the wake-up at once of a new subscription (the key is free)
	case <-wake:
	case <-ctx.Done():
		t.Fatal("no wake-up at once after subscribing")
	}
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "other", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, key, "other"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	case <-ctx.Done():
		t.Fatalf("not woken by a release after %s", when)
	}
}

// TestFrozenSubscriptionReconnect: a waiter gives up on a frozen pub/sub
// connection, then the connection ends (its client or the network gave up
// on it) and go-redis dials a new one, subscribing every channel again. The
// confirmation of the given-up subscription was lost with the old
// connection; a later waiter of the key must still be confirmed.
func TestFrozenSubscriptionReconnect(t *testing.T) {
	srv := testredis.Start(t)
	p := testredis.StartProxy(t, srv.Addr)
	s := newStore(t, splitClient{newClient(t, srv.Addr), newClient(t, p.Addr)}, redisstore.Options{})
	s.SetConfirmTimeout(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	_, stop, err := s.WaitRelease(ctx, "warm", "w0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	p.Pause()
	if _, _, err := s.WaitRelease(ctx, "lost", "w1"); !errors.Is(err, driver.ErrUnavailable) || ctx.Err() != nil {
		t.Fatalf("WaitRelease on a frozen connection: expected an error wrapping ErrUnavailable, got %v", err)
	}
	time.Sleep(50 * time.Millisecond) // the notifier acts on w1's leave (it used to UNSUBSCRIBE and skip the confirmation to come)
	p.Reset()
	// The new connection may come before or after this waiter's SUBSCRIBE.
	wokenByRelease(ctx, t, s, "lost", "w2", "a reconnect")
}
