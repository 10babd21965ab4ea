package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// scriptHook runs after with the command of the next script call with an
// argument that contains mark, once armed: after the script ran in Redis and before its
// reply reaches the store.
type scriptHook struct {
	mark  string
	armed atomic.Bool
	after func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error
}

func (h *scriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil || !isScript(cmd, h.mark) || !h.armed.CompareAndSwap(true, false) {
			return err // NOSCRIPT included: the script did not run
		}
		return h.after(ctx, cmd, next)
	}
}

// isScript reports whether cmd is a script call (EVALSHA, EVAL, FCALL) with
// a key or argument that contains mark.
func isScript(cmd redis.Cmder, mark string) bool {
	switch cmd.Name() {
	case "evalsha", "eval", "fcall":
	default:
		return false
	}
	for _, a := range cmd.Args()[3:] {
		if s, ok := a.(string); ok && strings.Contains(s, mark) {
			return true
		}
	}
	return false
}

// hookedLocker returns a Locker over a Store of its own client with h.
func hookedLocker(t *testing.T, srv *testredis.Server, h redis.Hook, opts leasehold.Options) (*leasehold.Locker, *redisstore.Store) {
	t.Helper()
	c := newClient(t, srv.Addr)
	if h != nil {
		c.AddHook(h)
	}
	s := newStore(t, c, redisstore.Options{})
	lk, err := leasehold.New(s, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk.Close() })
	return lk, s
}

// #27 (4): the reply of a release that handed the key to the head waiter is
// lost and go-redis sends the script again (MaxRetries); the retry finds the
// head holding the key. Release must still answer nil: its own release was
// applied. The hook resends the script as go-redis's retry does.
func TestRetriedReleaseAfterHandOffIsNotNotOwned(t *testing.T) {
	srv := testredis.Start(t)
	h := &scriptHook{mark: "}:wake", after: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		return next(ctx, cmd) // the first reply is lost; this is the retry's
	}}
	a, _ := hookedLocker(t, srv, h, leasehold.Options{TTL: 10 * time.Second})
	b, bs := hookedLocker(t, srv, nil, leasehold.Options{TTL: 10 * time.Second})
	ctx := t.Context()
	for round := range 5 {
		held, err := a.TryAcquire(ctx, "retried")
		if err != nil {
			t.Fatal(err)
		}
		got := acquireAsync(ctx, b, "retried")
		waitWaiting(t, bs, "retried", 1)
		h.armed.Store(true)
		if err := held.Release(ctx); err != nil {
			t.Fatalf("round %d: expected Release to answer nil when the retry of a lost reply finds its own release applied, got %v", round, err)
		}
		r := <-got
		if r.err != nil {
			t.Fatalf("round %d: the waiter: %v", round, r.err)
		}
		if err := r.ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// waitWaiting waits until key has n waiters queued.
func waitWaiting(t *testing.T, s *redisstore.Store, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := s.Inspect(t.Context(), key)
		if err == nil && info.Waiting == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q: expected %d waiter(s) within 10 s, got %+v, %v", key, n, info, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// #28 (2) against Redis: an acquire applied by Redis whose caller's context
// ends before the reply arrives gives no lease; the Locker releases the
// grant long before its TTL.
func TestGrantThatRacedCancellationIsReleased(t *testing.T) {
	srv := testredis.Start(t)
	var cancel context.CancelFunc
	h := &scriptHook{mark: "}:fence", after: func(context.Context, redis.Cmder, redis.ProcessHook) error {
		cancel()
		return nil
	}}
	for _, policy := range []leasehold.StorePolicy{leasehold.FailClosed, leasehold.FailOpen} {
		lk, s := hookedLocker(t, srv, h, leasehold.Options{TTL: time.Minute, OnStoreError: policy})
		for name, call := range map[string]func(ctx context.Context) (*leasehold.Lease, error){
			"TryAcquire": func(ctx context.Context) (*leasehold.Lease, error) { return lk.TryAcquire(ctx, "raced") },
			"Acquire":    func(ctx context.Context) (*leasehold.Lease, error) { return lk.Acquire(ctx, "raced") },
		} {
			ctx, stop := context.WithCancel(t.Context())
			cancel = stop
			h.armed.Store(true)
			lease, err := call(ctx)
			stop()
			if lease != nil || !errors.Is(err, context.Canceled) {
				t.Fatalf("%v %s: expected no lease and context.Canceled, got lease=%v, %v", policy, name, lease != nil, err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				_, err := s.Inspect(t.Context(), "raced")
				if errors.Is(err, leasehold.ErrNotHeld) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%v %s: the grant is still held 5 s after the caller gave up (TTL 1 min): %v", policy, name, err)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
}

// The reply of a release that left nobody queued is lost, another process
// takes the free key, and go-redis sends the script again: Release must
// still answer nil, as when the release had handed the key to a waiter.
func TestRetriedReleaseAfterANewcomerIsNotNotOwned(t *testing.T) {
	srv := testredis.Start(t)
	b, _ := hookedLocker(t, srv, nil, leasehold.Options{TTL: 10 * time.Second})
	var taken *leasehold.Lease
	h := &scriptHook{mark: "}:wake", after: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		var err error
		if taken, err = b.TryAcquire(ctx, "newcomer"); err != nil {
			return err
		}
		return next(ctx, cmd) // the first reply is lost; this is the retry's
	}}
	a, _ := hookedLocker(t, srv, h, leasehold.Options{TTL: 10 * time.Second})
	ctx := t.Context()
	held, err := a.TryAcquire(ctx, "newcomer")
	if err != nil {
		t.Fatal(err)
	}
	h.armed.Store(true)
	if err := held.Release(ctx); err != nil {
		t.Fatalf("expected Release to answer nil when the retry of a lost reply finds the key taken after its release, got %v", err)
	}
	if taken == nil {
		t.Fatal("the newcomer did not take the key")
	}
	if err := taken.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// The reply of a release that handed the key to the head waiter is lost;
// before go-redis sends it again, the head releases the key (leaving nobody
// queued) and a newcomer takes it. The retry must still answer nil: the
// record of the first release must not be the head's release's.
func TestRetriedReleaseAfterTheHeadReleasedIsNotNotOwned(t *testing.T) {
	srv := testredis.Start(t)
	other := newStore(t, newClient(t, srv.Addr), redisstore.Options{})
	ctx := t.Context()
	const key = "headreleased"
	h := &scriptHook{mark: "}:wake", after: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if err := other.Release(ctx, key, "head"); err != nil {
			return err
		}
		if _, err := other.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "newcomer", TTL: time.Minute}); err != nil {
			return err
		}
		return next(ctx, cmd) // the first reply is lost; this is the retry's
	}}
	c := newClient(t, srv.Addr)
	c.AddHook(h)
	s := newStore(t, c, redisstore.Options{})
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "head", TTL: time.Minute, QueueTTL: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("head: expected ErrNotAcquired, got %v", err)
	}
	h.armed.Store(true)
	if err := s.Release(ctx, key, "holder"); err != nil {
		t.Fatalf("expected Release to answer nil when the retry of a lost reply finds the key taken after its release, got %v", err)
	}
}

// A waiter heads the queue of a key whose holder expired and gives up:
// its Release hands the key to the next waiter. The reply is lost, and
// go-redis's retry finds that waiter holding the key. The retry must answer
// what the release it repeats answered (nobody held the key), not
// ErrNotOwned.
func TestRetriedReleaseOfAHeadThatGaveUpIsNotNotOwned(t *testing.T) {
	srv := testredis.Start(t)
	other := newStore(t, newClient(t, srv.Addr), redisstore.Options{})
	ctx := t.Context()
	const key = "gaveup"
	h := &scriptHook{mark: "}:wake", after: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		return next(ctx, cmd) // the first reply is lost; this is the retry's
	}}
	c := newClient(t, srv.Addr)
	c.AddHook(h)
	s := newStore(t, c, redisstore.Options{})
	if _, err := other.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "holder", TTL: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		st    *redisstore.Store
		token string
	}{{s, "head"}, {other, "next"}} {
		if _, err := w.st.Acquire(ctx, driver.AcquireRequest{Key: key, Token: w.token, TTL: time.Minute, QueueTTL: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("%s: expected ErrNotAcquired, got %v", w.token, err)
		}
	}
	time.Sleep(100 * time.Millisecond) // the holder's lock expires; "head" heads a free key
	h.armed.Store(true)
	if err := s.Release(ctx, key, "head"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("expected the retried Release of a head that gave up to answer ErrNotHeld, as its first run did, got %v", err)
	}
	info, err := other.Inspect(ctx, key)
	if err != nil || info.Token != "next" {
		t.Fatalf("expected the release to hand the key to the next waiter, got %+v, %v", info, err)
	}
}
