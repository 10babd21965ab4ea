package leasehold_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
)

// stallAcquires makes every acquire hang until its context ends: a
// black-holed store.
func stallAcquires(store *memstore.Store) {
	store.SetFaults(func(op memstore.Op, _ string) memstore.Fault {
		if op == memstore.OpAcquire {
			return memstore.Fault{Delay: time.Hour}
		}
		return memstore.Fault{}
	})
}

// #12 (4): a deadline with no answer from the store is a store failure, not
// contention.
func TestDeadlineWithoutAnAnswerIsAStoreFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		l, rec, _ := newLocker(t, store, leasehold.Options{})
		stallAcquires(store)
		for name, call := range map[string]func(context.Context) error{
			"TryAcquire": func(ctx context.Context) error { _, err := l.TryAcquire(ctx, "k"); return err },
			"Acquire":    func(ctx context.Context) error { _, err := l.Acquire(ctx, "k"); return err },
		} {
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			err := call(ctx)
			cancel()
			var se *leasehold.StoreError
			if !errors.As(err, &se) || !errors.Is(err, leasehold.ErrStore) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%s: expected a *StoreError matching ErrStore and DeadlineExceeded, got %v", name, err)
			}
			if errors.Is(err, leasehold.ErrNotAcquired) {
				t.Fatalf("%s: a hung store must not look like contention: %v", name, err)
			}
		}
		if n := len(rec.find(leasehold.EventContention)); n != 0 {
			t.Fatalf("expected no contention counted, got %d", n)
		}
	})
}

// FailOpen applies only to an error the store marked as an outage
// (ErrUnavailable); a configuration error and an error nobody classified
// fail closed.
func TestFailOpenOnlyOnAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		l, rec, _ := newLocker(t, store, leasehold.Options{OnStoreError: leasehold.FailOpen})
		store.SetDown(true)
		lease, err := l.TryAcquire(t.Context(), "down")
		if err != nil || !lease.Degraded() {
			t.Fatalf("expected a degraded lease when the store is down, got %v, %v", lease, err)
		}
		_ = lease.Release(t.Context())
		store.SetDown(false)

		for _, fault := range []error{
			fmt.Errorf("%w: WRONGPASS invalid username-password pair", leasehold.ErrMisconfigured),
			errors.New("an error no store classified"),
		} {
			store.SetFaults(func(op memstore.Op, _ string) memstore.Fault {
				return memstore.Fault{Err: fault}
			})
			lease, err = l.TryAcquire(t.Context(), "bad")
			if lease != nil || !errors.Is(err, fault) || !errors.Is(err, leasehold.ErrStore) {
				t.Fatalf("expected %q to fail closed under FailOpen, got %v, %v", fault, lease, err)
			}
		}
		if n := rec.count(leasehold.EventFailOpen); n != 1 {
			t.Fatalf("expected exactly 1 fail-open (the store that was down), got %d", n)
		}
	})
}

// #12 (5): a lock already gone at release is not "not owned".
func TestReleaseOfAnAlreadyGoneLockIsNotAnError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newRecordingStore()
		l, _, logs := newLocker(t, store, leasehold.Options{})
		lease, err := l.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		// A retried compare-and-delete whose first try was applied.
		store.release = func(key, token string) error {
			_ = store.Store.Release(context.Background(), key, token)
			return leasehold.ErrNotHeld
		}
		if err := lease.Release(t.Context()); err != nil {
			t.Fatalf("expected nil for a lock already gone, got %v", err)
		}
		if !strings.Contains(logs.String(), "already gone") {
			t.Fatalf("expected a debug record, got %q", logs)
		}
		other, err := l.TryAcquire(t.Context(), "k2")
		if err != nil {
			t.Fatal(err)
		}
		store.release = func(string, string) error { return leasehold.ErrNotOwned }
		if err := other.Release(t.Context()); !errors.Is(err, leasehold.ErrNotOwned) {
			t.Fatalf("expected ErrNotOwned when another token holds the key, got %v", err)
		}
	})
}

// #12 (6): the release of an acquisition whose reply was lost survives
// Close, and Close waits for it.
func TestLostAcquireReplyIsReleasedEvenWhenClosedAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		l, err := leasehold.New(store, leasehold.Options{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		store.SetFaults(func(op memstore.Op, _ string) memstore.Fault {
			switch op {
			case memstore.OpAcquire:
				return memstore.Fault{DropReply: true}
			case memstore.OpRelease:
				return memstore.Fault{Delay: 10 * time.Millisecond}
			}
			return memstore.Fault{}
		})
		if _, err := l.TryAcquire(t.Context(), "k"); !errors.Is(err, leasehold.ErrStore) {
			t.Fatalf("expected a store error, got %v", err)
		}
		_ = l.Close() // as the CLI does right after
		store.SetFaults(nil)
		if _, err := store.Inspect(t.Context(), "k"); !errors.Is(err, leasehold.ErrNotHeld) {
			t.Fatalf("expected the orphaned lock released by the time Close returned, got %v", err)
		}
	})
}

// A degraded lease from TryAcquire has no local guard (it is local-only and
// renewed by nobody), also after a manual Renew.
func TestDegradedLeaseStaysUntilReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		l, _, _ := newLocker(t, store, leasehold.Options{TTL: time.Second, OnStoreError: leasehold.FailOpen})
		store.SetDown(true)
		lease, err := l.TryAcquire(t.Context(), "k")
		if err != nil || !lease.Degraded() {
			t.Fatalf("expected a degraded lease, got %v, %v", lease, err)
		}
		if err := lease.Renew(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		if err := lease.Err(); err != nil {
			t.Fatalf("expected the degraded lease to stay until released, got %v", err)
		}
		if err := lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}

// A release lost to an outage is retried in the background until the store
// answers, so the key does not wait out the lock's TTL (on etcd, a lock
// handed to a waiter lives on its Store's presence until its first renewal
// moves it: a lost release held the key while that Store kept waiting).
// Close ends the retries.
func TestLostReleaseIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		l, _, _ := newLocker(t, store, leasehold.Options{TTL: time.Minute})
		fails := map[string]*atomic.Int32{"k": {}, "closed": {}} // releases to fail, by key
		fails["k"].Store(3)
		fails["closed"].Store(1 << 30)
		store.SetFaults(func(op memstore.Op, key string) memstore.Fault {
			if op == memstore.OpRelease && fails[key].Add(-1) >= 0 {
				return memstore.Fault{Err: memstore.ErrUnavailable}
			}
			return memstore.Fault{}
		})
		for _, key := range []string{"closed", "k"} { // "closed" first: it must not hold up "k"
			lease, err := l.Acquire(t.Context(), key)
			if err != nil {
				t.Fatal(err)
			}
			if err := lease.Release(t.Context()); !errors.Is(err, leasehold.ErrUnavailable) {
				t.Fatalf("%s: expected the release to fail with ErrUnavailable, got %v", key, err)
			}
		}
		time.Sleep(10 * time.Second)
		if _, err := store.Inspect(t.Context(), "k"); !errors.Is(err, leasehold.ErrNotHeld) {
			t.Fatalf("expected the retried release to free the key, got %v", err)
		}
		if err := l.Close(); err != nil { // ends the retries of "closed" (synctest: a hang fails)
			t.Fatal(err)
		}
		if _, err := store.Inspect(t.Context(), "closed"); err != nil {
			t.Fatalf("expected the never-released lock to stay held, got %v", err)
		}
	})
}
