package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
)

// nothingLeftAfterClose checks that a store and its Lockers leave no
// server-side state behind once they are closed: released and expired locks,
// a waiter's subscription, and what Lockers held or waited for at their
// Close (lockersCleanUp). The stores keep no lock state of their own: a lock
// or queue entry is released by the Locker that holds it, or ends at its TTL.
// Harness.Leftovers lists what is left (documented fence state excepted); it
// runs after the cleanups of a nested subtest closed every store it created.
func (r *runner) nothingLeftAfterClose(t *testing.T) {
	if r.h.Leftovers == nil {
		t.Skip("Harness.Leftovers is nil")
	}
	t.Run("work", func(t *testing.T) {
		s1, s2 := r.store(t), r.store(t)
		ctx := ctxFor(t, 20*time.Second)
		for i := range 20 { // released
			key, tok := r.key(t, fmt.Sprintf("cycle%d", i%4)), fmt.Sprintf("t%d", i)
			mustAcquire(t, s1, key, tok, time.Duration(1+i%3)*time.Second)
			if i%2 == 0 {
				if err := s1.Renew(ctx, key, tok, time.Minute); err != nil {
					t.Fatalf("Renew: %v", err)
				}
			}
			mustRelease(t, s1, key, tok)
		}
		if n, ok := s2.(driver.Notifier); ok { // a subscription, stopped before Close
			_, stop, err := n.WaitRelease(ctx, r.key(t, "sub"), "sub")
			if err != nil {
				t.Fatalf("WaitRelease: %v", err)
			}
			t.Cleanup(stop) // runs before the stores' Close (cleanups run last in, first out)
		}
		mustAcquire(t, s2, r.key(t, "expired"), "x", 50*time.Millisecond) // left to expire
		r.lockersCleanUp(t, ctx, s1, s2)
		time.Sleep(200*time.Millisecond + r.h.Slack)
	})
	if left := r.h.Leftovers(t); len(left) > 0 {
		t.Fatalf("after every store was closed: expected no server-side state, got %d: %s", len(left), strings.Join(left, "; "))
	}
}

// lockerCloseCleansUp runs lockersCleanUp on its own, for stores without
// Harness.Leftovers too.
func (r *runner) lockerCloseCleansUp(t *testing.T) {
	r.lockersCleanUp(t, ctxFor(t, 20*time.Second), r.store(t), r.store(t))
}

// lockersCleanUp checks that the Locker is the one owner of clean-up: a
// Locker over s1 holds two keys; a Locker over s2 waits in the first key's
// queue and is closed mid-wait (its Acquire returns ErrLockerClosed, and its
// queue entry is gone when Close returns); another over s2 waits for the
// second key and gives up as the holder releases it (a grant that raced its
// giving up is released by its Locker); then the holder's Locker is closed
// holding the first key, which Close releases.
func (r *runner) lockersCleanUp(t *testing.T, ctx context.Context, s1, s2 fullStore) {
	t.Helper()
	newLocker := func(s driver.Store) *leasehold.Locker {
		lk, err := leasehold.New(s, leasehold.Options{Name: "storetest", TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lk.Close() })
		return lk
	}
	holder, waiter, quitter := newLocker(s1), newLocker(s2), newLocker(s2)
	held, raced := r.key(t, "held"), r.key(t, "raced")
	if _, err := holder.TryAcquire(ctx, held); err != nil {
		t.Fatalf("Locker.TryAcquire: %v", err)
	}
	racedLease, err := holder.TryAcquire(ctx, raced)
	if err != nil {
		t.Fatalf("Locker.TryAcquire: %v", err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(ctx, held)
		waited <- err
	}()
	qctx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	quit := make(chan error, 1)
	go func() {
		ls, err := quitter.Acquire(qctx, raced)
		if ls != nil { // the release came first
			err = ls.Release(ctx)
		}
		quit <- err
	}()
	r.awaitWaiting(t, ctx, s1, held, 1)
	r.awaitWaiting(t, ctx, s1, raced, 1)

	go giveUp()
	if err := racedLease.Release(ctx); err != nil {
		t.Fatalf("Lease.Release: %v", err)
	}
	if err := <-quit; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("a waiter giving up as the key is released: expected its lease or context.Canceled, got %v", err)
	}

	if err := waiter.Close(); err != nil {
		t.Fatalf("Locker.Close: %v", err)
	}
	if err := <-waited; !errors.Is(err, leasehold.ErrLockerClosed) {
		t.Fatalf("Acquire waiting when its Locker closed: expected ErrLockerClosed, got %v", err)
	}
	if info, err := s1.Inspect(ctx, held); err != nil || info.Waiting != 0 {
		t.Fatalf("after the waiter's Locker closed: expected the key held with nobody queued, got %+v, %v", info, err)
	}
	for _, lk := range []*leasehold.Locker{holder, quitter} {
		if err := lk.Close(); err != nil {
			t.Fatalf("Locker.Close: %v", err)
		}
	}
	for _, key := range []string{held, raced} {
		if info, err := s1.Inspect(ctx, key); !errors.Is(err, leasehold.ErrNotHeld) {
			t.Fatalf("after every Locker closed: expected %q free, got %+v, %v", key, info, err)
		}
	}
}

// awaitWaiting waits until key has n waiters in s's view.
func (r *runner) awaitWaiting(t *testing.T, ctx context.Context, s fullStore, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(10*time.Second + r.h.Slack)
	for {
		info, err := s.Inspect(ctx, key)
		if err == nil && info.Waiting == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("expected %d waiters of %q within 10s, got %+v, %v", n, key, info, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
