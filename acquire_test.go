package leasehold_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
)

func TestTryAcquireOneWinnerAmong100Goroutines(t *testing.T) {
	for _, tc := range []struct {
		name    string
		lockers int
	}{{"one locker", 1}, {"locker per goroutine", 100}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memstore.New()
				lockers := make([]*leasehold.Locker, tc.lockers)
				for i := range lockers {
					lockers[i], _, _ = newLocker(t, store, leasehold.Options{TTL: 5 * time.Second})
				}
				var wins, contended atomic.Int32
				var wg sync.WaitGroup
				start := make(chan struct{})
				for i := range 100 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						_, err := lockers[i%len(lockers)].TryAcquire(t.Context(), "job:42")
						switch {
						case err == nil:
							wins.Add(1)
						case errors.Is(err, leasehold.ErrNotAcquired):
							contended.Add(1)
						default:
							t.Errorf("expected nil or ErrNotAcquired, got %v", err)
						}
					}()
				}
				close(start)
				wg.Wait()
				if wins.Load() != 1 || contended.Load() != 99 {
					t.Fatalf("expected 1 winner and 99 contended, got %d and %d", wins.Load(), contended.Load())
				}
			})
		})
	}
}

func TestLocalGateSendsOneStoreRequestPerKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		ops := countOps(store, nil)
		l, rec, _ := newLocker(t, store, leasehold.Options{TTL: 5 * time.Second})
		if _, err := l.TryAcquire(t.Context(), "k"); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := l.TryAcquire(t.Context(), "k"); !errors.Is(err, leasehold.ErrNotAcquired) {
					t.Errorf("expected ErrNotAcquired, got %v", err)
				}
			}()
		}
		wg.Wait()
		if got := ops.get(memstore.OpAcquire); got != 1 {
			t.Fatalf("expected 1 store acquire (the gate absorbs local contention), got %d", got)
		}
		if got := rec.count(leasehold.EventContention); got != 50 {
			t.Fatalf("expected 50 contention events, got %d", got)
		}
	})
}

func TestBlockingAcquiresKeepOneStoreRequestInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		ops := countOps(store, nil)
		l, _, _ := newLocker(t, store, leasehold.Options{TTL: 5 * time.Second})
		lease, err := l.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		// Blocking acquirers queue on the gate: one store request in flight.
		var inflight, maxInflight atomic.Int32
		ops.setFail(func(op memstore.Op, key string) memstore.Fault {
			if op == memstore.OpAcquire {
				n := inflight.Add(1)
				for {
					m := maxInflight.Load()
					if n <= m || maxInflight.CompareAndSwap(m, n) {
						break
					}
				}
				time.Sleep(time.Millisecond)
				inflight.Add(-1)
			}
			return memstore.Fault{}
		})
		got := make(chan *leasehold.Lease, 5)
		for range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ls, err := l.Acquire(t.Context(), "k")
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				got <- ls
			}()
		}
		time.Sleep(50 * time.Millisecond)
		if err := lease.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			ls := <-got
			if err := ls.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		wg.Wait()
		if m := maxInflight.Load(); m != 1 {
			t.Fatalf("expected at most 1 store acquire in flight per key, got %d", m)
		}
	})
}

func TestStaleReleaseAfterExpiryLeavesNewOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := newFakeClock()
		store := memstore.New(memstore.WithClock(clock.Now))
		a, _, _ := newLocker(t, store, leasehold.Options{Name: "a", TTL: time.Minute})
		b, recB, _ := newLocker(t, store, leasehold.Options{Name: "b", TTL: time.Minute})
		_ = recB
		la, err := a.TryAcquire(t.Context(), "job")
		if err != nil {
			t.Fatal(err)
		}
		clock.Advance(2 * time.Minute) // the store expires A's lock; A's own clock has not noticed
		lb, err := b.TryAcquire(t.Context(), "job")
		if err != nil {
			t.Fatalf("B acquire after expiry: %v", err)
		}
		if lb.Fence() <= la.Fence() {
			t.Fatalf("expected B's fence > A's %d, got %d", la.Fence(), lb.Fence())
		}
		if err := la.Release(t.Context()); !errors.Is(err, leasehold.ErrNotOwned) {
			t.Fatalf("expected ErrNotOwned from stale release, got %v", err)
		}
		info, err := store.Inspect(t.Context(), "job")
		if err != nil || info.Token != lb.Token() {
			t.Fatalf("expected B's lock (token %s) intact, got %+v, %v", lb.Token(), info, err)
		}
		if err := lb.Release(t.Context()); err != nil {
			t.Fatalf("B release: %v", err)
		}
	})
}

func TestFailClosedReturnsTheStoreError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		l, rec, _ := newLocker(t, store, leasehold.Options{})
		store.SetDown(true)
		lease, err := l.TryAcquire(t.Context(), "approval:1")
		if lease != nil || !errors.Is(err, leasehold.ErrStore) || !errors.Is(err, memstore.ErrUnavailable) {
			t.Fatalf("expected nil lease and an error matching ErrStore and the store's error, got %v, %v", lease, err)
		}
		if errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("a store failure must not look like contention: %v", err)
		}
		if rec.count(leasehold.EventFailOpen) != 0 {
			t.Fatal("expected no fail-open event under FailClosed")
		}
		ran := false
		err = l.Do(t.Context(), "approval:1", func(context.Context, *leasehold.Lease) error { ran = true; return nil })
		if ran || !errors.Is(err, leasehold.ErrStore) {
			t.Fatalf("expected Do not to run under fail-closed, ran=%v err=%v", ran, err)
		}
	})
}

func TestFailOpenReturnsADegradedLocalLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		l, rec, logs := newLocker(t, store, leasehold.Options{OnStoreError: leasehold.FailOpen})
		store.SetDown(true)
		lease, err := l.TryAcquire(t.Context(), "cleanup:1")
		if err != nil {
			t.Fatalf("expected a degraded lease, got %v", err)
		}
		if !lease.Degraded() || lease.Fence() != 0 {
			t.Fatalf("expected Degraded()==true and fence 0, got %v and %d", lease.Degraded(), lease.Fence())
		}
		if n := rec.count(leasehold.EventFailOpen); n != 1 {
			t.Fatalf("expected 1 fail-open event, got %d", n)
		}
		if n := logs.count("cross-replica races are now possible"); n != 1 {
			t.Fatalf("expected one high-signal log line, got %d: %s", n, logs)
		}
		// The local gate still excludes goroutines of this process.
		if _, err := l.TryAcquire(t.Context(), "cleanup:1"); !errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("expected local exclusion of a degraded lease, got %v", err)
		}
		if err := lease.Release(t.Context()); err != nil {
			t.Fatalf("release degraded: %v", err)
		}
	})
}

func TestContentionNeverFailsOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		other, _, _ := newLocker(t, store, leasehold.Options{})
		l, rec, _ := newLocker(t, store, leasehold.Options{OnStoreError: leasehold.FailOpen})
		held, err := other.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release(t.Context())
		lease, err := l.TryAcquire(t.Context(), "k")
		if lease != nil || !errors.Is(err, leasehold.ErrNotAcquired) || errors.Is(err, leasehold.ErrStore) {
			t.Fatalf("expected ErrNotAcquired and no lease, got %v, %v", lease, err)
		}
		if n := rec.count(leasehold.EventFailOpen); n != 0 {
			t.Fatalf("expected no fail-open on contention, got %d", n)
		}
	})
}

func withTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestFencesIncreaseAcrossExpiryReleaseAndRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := newFakeClock()
		store := memstore.New(memstore.WithClock(clock.Now))
		l, _, _ := newLocker(t, store, leasehold.Options{TTL: time.Minute})
		var last uint64
		check := func(ls *leasehold.Lease) {
			t.Helper()
			if ls.Fence() <= last {
				t.Fatalf("expected fence > %d, got %d", last, ls.Fence())
			}
			last = ls.Fence()
		}
		for i := range 20 {
			ls, err := l.Hold(t.Context(), "k", 0)
			if err != nil {
				t.Fatal(err)
			}
			check(ls)
			switch i % 3 {
			case 0:
				if err := ls.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
			case 1:
				clock.Advance(2 * time.Minute) // store-side expiry
				_ = ls.Release(t.Context())    // not owned: the store expired it
			case 2:
				clock.Advance(time.Second)
				store.Restart() // data loss: the clock floor keeps fences rising
				_ = ls.Release(t.Context())
			}
		}
	})
}

func TestAcquireWaitsForReleaseNotification(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		holder, _, _ := newLocker(t, store, leasehold.Options{TTL: 30 * time.Second})
		waiter, _, _ := newLocker(t, store, leasehold.Options{TTL: 30 * time.Second, WaitCap: 20 * time.Second})
		held, err := holder.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			ls, err := waiter.Acquire(withTimeout(t, 10*time.Second), "k")
			if err != nil {
				t.Errorf("Acquire: %v", err)
				close(got)
				return
			}
			got <- time.Now()
			_ = ls.Release(context.Background())
		}()
		time.Sleep(100 * time.Millisecond)
		released := time.Now()
		if err := held.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		at, ok := <-got
		if !ok {
			t.FailNow()
		}
		// Without the notification the waiter would sleep until the holder's
		// 30 s TTL (capped at 20 s): a wake-up within 5 s proves the notification.
		if d := at.Sub(released); d > 5*time.Second {
			t.Fatalf("expected a notified wake-up, got %v after release", d)
		}
	})
}

func TestAcquireTakesOverAfterCrashedHolderTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		crashed, _, _ := newLocker(t, store, leasehold.Options{})
		waiter, _, _ := newLocker(t, store, leasehold.Options{})
		const ttl = 300 * time.Millisecond
		// A hold is never renewed nor released: like a holder that died.
		if _, err := crashed.Hold(t.Context(), "k", ttl); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		ls, err := waiter.Acquire(withTimeout(t, 5*time.Second), "k")
		if err != nil {
			t.Fatalf("expected takeover after the TTL, got %v", err)
		}
		defer ls.Release(t.Context())
		if d := time.Since(start); d < ttl-50*time.Millisecond {
			t.Fatalf("expected to wait for the TTL (%v), got %v", ttl, d)
		}
	})
}

func TestAcquireGivesUpWithBothCauses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		a, _, _ := newLocker(t, store, leasehold.Options{})
		b, rec, _ := newLocker(t, store, leasehold.Options{})
		held, err := a.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release(t.Context())
		_, err = b.Acquire(withTimeout(t, 100*time.Millisecond), "k")
		if !errors.Is(err, leasehold.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("expected ErrNotAcquired joined with DeadlineExceeded, got %v", err)
		}
		ev := rec.find(leasehold.EventAcquire)
		if len(ev) != 1 || ev[0].Result != leasehold.ResultContended {
			t.Fatalf("expected one contended acquire event, got %+v", ev)
		}
	})
}

func TestCloseCancelsAndReleasesEveryLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		l, err := leasehold.New(store, leasehold.Options{})
		if err != nil {
			t.Fatal(err)
		}
		var leases []*leasehold.Lease
		for _, k := range []string{"a", "b", "c"} {
			ls, err := l.TryAcquire(t.Context(), k)
			if err != nil {
				t.Fatal(err)
			}
			leases = append(leases, ls)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		for _, ls := range leases {
			if cause := context.Cause(ls.Context()); !errors.Is(cause, leasehold.ErrLockerClosed) {
				t.Fatalf("expected cause ErrLockerClosed, got %v", cause)
			}
			if err := ls.Release(t.Context()); err != nil {
				t.Fatalf("release after close: %v", err)
			}
		}
		if infos, _ := store.List(t.Context(), ""); len(infos) != 0 {
			t.Fatalf("expected Close to release every lock, %d left", len(infos))
		}
		if _, err := l.TryAcquire(t.Context(), "a"); !errors.Is(err, leasehold.ErrLockerClosed) {
			t.Fatalf("expected ErrLockerClosed after Close, got %v", err)
		}
	})
}

func TestBadInput(t *testing.T) {
	store := memstore.New()
	for _, tc := range []struct {
		name string
		opts leasehold.Options
		want string
	}{
		{"negative TTL", leasehold.Options{TTL: -time.Second}, "TTL must be > 0"},
		{"renew interval not below TTL", leasehold.Options{TTL: time.Second, RenewInterval: time.Second}, "RenewInterval (1s) must be shorter than TTL"},
		{"negative renew interval", leasehold.Options{RenewInterval: -1}, "RenewInterval must be > 0"},
		{"renew timeout not below TTL", leasehold.Options{TTL: time.Second, RenewTimeout: 2 * time.Second}, "RenewTimeout (2s) must be shorter"},
		{"negative failures", leasehold.Options{MaxRenewFailures: -1}, "MaxRenewFailures must be >= 1"},
		{"unknown renewal policy", leasehold.Options{OnRenewFailure: 7}, "unknown OnRenewFailure"},
		{"unknown store policy", leasehold.Options{OnStoreError: 9}, "unknown OnStoreError"},
		{"negative max hold", leasehold.Options{MaxHold: -time.Second}, "MaxHold must be >= 0"},
		{"drift not below TTL", leasehold.Options{TTL: time.Second, DriftMargin: time.Second}, "DriftMargin (1s) must be shorter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := leasehold.New(store, tc.opts)
			if !errors.Is(err, leasehold.ErrInvalidOptions) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("expected ErrInvalidOptions mentioning %q, got %v", tc.want, err)
			}
		})
	}
	if _, err := leasehold.New(nil, leasehold.Options{}); !errors.Is(err, leasehold.ErrInvalidOptions) {
		t.Fatalf("expected ErrInvalidOptions for a nil store, got %v", err)
	}

	t.Run("budget above TTL warns", func(t *testing.T) {
		logs := &syncBuffer{}
		_, _, _ = newLocker(t, store, leasehold.Options{TTL: time.Second, RenewInterval: 500 * time.Millisecond, RenewTimeout: 200 * time.Millisecond, Logger: slogTo(logs)})
		if logs.count("renewal failure budget exceeds the TTL") != 1 {
			t.Fatalf("expected a warning, got %q", logs)
		}
	})

	l, _, _ := newLocker(t, store, leasehold.Options{TTL: time.Second})
	for _, tc := range []struct{ key, want string }{
		{"", "key is empty"},
		{strings.Repeat("k", leasehold.MaxKeyLen+1), "the limit is 512"},
		{"job\n42", "control character"},
		{"job\x00", "control character"},
		{"bad\xff", "not valid UTF-8"},
	} {
		for name, call := range map[string]func() error{
			"TryAcquire": func() error { _, err := l.TryAcquire(t.Context(), tc.key); return err },
			"Acquire":    func() error { _, err := l.Acquire(t.Context(), tc.key); return err },
			"Hold":       func() error { _, err := l.Hold(t.Context(), tc.key, 0); return err },
			"Do": func() error {
				return l.Do(t.Context(), tc.key, func(context.Context, *leasehold.Lease) error { return nil })
			},
		} {
			if err := call(); !errors.Is(err, leasehold.ErrInvalidKey) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s(%q): expected ErrInvalidKey mentioning %q, got %v", name, tc.key, tc.want, err)
			}
		}
	}
	if _, err := l.Hold(t.Context(), "k", -time.Second); !errors.Is(err, leasehold.ErrInvalidOptions) {
		t.Errorf("expected ErrInvalidOptions for a negative hold TTL, got %v", err)
	}
	if err := l.Loop(t.Context(), "k", 2*time.Second, nil); !errors.Is(err, leasehold.ErrInvalidOptions) {
		t.Errorf("expected ErrInvalidOptions for a loop interval above the TTL, got %v", err)
	}
	if infos, _ := store.List(t.Context(), ""); len(infos) != 0 {
		t.Fatalf("expected bad input to touch nothing, found %d locks", len(infos))
	}
}

func TestLostAcquireReplyLeavesNoOrphanLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, policy := range []leasehold.StorePolicy{leasehold.FailClosed, leasehold.FailOpen} {
			store := memstore.New()
			l, _, _ := newLocker(t, store, leasehold.Options{OnStoreError: policy})
			store.SetFaults(func(op memstore.Op, _ string) memstore.Fault {
				if op == memstore.OpAcquire {
					return memstore.Fault{DropReply: true}
				}
				return memstore.Fault{}
			})
			lease, err := l.TryAcquire(t.Context(), "k")
			switch policy {
			case leasehold.FailClosed:
				if !errors.Is(err, leasehold.ErrStore) {
					t.Fatalf("expected a store error, got %v", err)
				}
			case leasehold.FailOpen:
				if err != nil || !lease.Degraded() {
					t.Fatalf("expected a degraded lease, got %v, %v", lease, err)
				}
				defer lease.Release(t.Context())
			}
			store.SetFaults(nil)
			deadline := time.Now().Add(2 * time.Second)
			for {
				if _, err := store.Inspect(t.Context(), "k"); errors.Is(err, leasehold.ErrNotHeld) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%v: expected the lock whose reply was lost to be released, it is still held", policy)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	})
}

func TestNoFailOpenAfterContentionWasSeen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		holder, _, _ := newLocker(t, store, leasehold.Options{})
		waiter, rec, _ := newLocker(t, store, leasehold.Options{OnStoreError: leasehold.FailOpen})
		held, err := holder.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release(t.Context())
		go func() {
			time.Sleep(100 * time.Millisecond)
			store.SetDown(true)
		}()
		lease, err := waiter.Acquire(withTimeout(t, 5*time.Second), "k")
		store.SetDown(false)
		if lease != nil || !errors.Is(err, leasehold.ErrStore) {
			t.Fatalf("expected the store error, not a degraded lease, after another owner was seen: %v, %v", lease, err)
		}
		if n := rec.count(leasehold.EventFailOpen); n != 0 {
			t.Fatalf("expected no fail-open, got %d", n)
		}
	})
}

func TestCloseWakesWaitingAcquires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		holder, _, _ := newLocker(t, store, leasehold.Options{})
		l, err := leasehold.New(store, leasehold.Options{WaitCap: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		held, err := holder.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release(t.Context())
		errs := make(chan error, 2)
		for range 2 { // one waits in the store loop, the other on the local gate
			go func() {
				_, err := l.Acquire(context.Background(), "k")
				errs <- err
			}()
		}
		time.Sleep(100 * time.Millisecond)
		_ = l.Close()
		for range 2 {
			select {
			case err := <-errs:
				if !errors.Is(err, leasehold.ErrLockerClosed) {
					t.Fatalf("expected ErrLockerClosed, got %v", err)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("expected Close to wake every waiting Acquire")
			}
		}
	})
}
