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
	"github.com/leasehold/leasehold/calibrate"
	"github.com/leasehold/leasehold/memstore"
)

// failRenewals makes every renewal fail with ErrUnavailable (delay 0) or
// stall past its deadline (delay > 0).
func failRenewals(ops *opCounter, delay time.Duration) {
	ops.setFail(func(op memstore.Op, _ string) memstore.Fault {
		if op != memstore.OpRenew && op != memstore.OpRenewBatch {
			return memstore.Fault{}
		}
		if delay > 0 {
			return memstore.Fault{Delay: delay}
		}
		return memstore.Fault{Err: memstore.ErrUnavailable}
	})
}

// Bug (a): Close cancelled the renewal context first, and a lease whose
// renewal fell due before Close reached it renewed again and again with the
// cancelled context (112,740 renewals in one Close).
func TestCloseMakesNoRenewalStorm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		ops := countOps(store, nil)
		l, _, _ := newLocker(t, store, leasehold.Options{TTL: time.Second, RenewInterval: 100 * time.Millisecond})
		acquireMany(t, l, 4)
		// Close's releases are slow: renewals fall due while it runs.
		ops.setFail(func(op memstore.Op, _ string) memstore.Fault {
			if op == memstore.OpRelease {
				return memstore.Fault{Delay: 150 * time.Millisecond}
			}
			return memstore.Fault{}
		})
		time.Sleep(50 * time.Millisecond)
		before := ops.get(memstore.OpRenew) + ops.get(memstore.OpRenewBatch)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if n := ops.get(memstore.OpRenew) + ops.get(memstore.OpRenewBatch) - before; n > 1 {
			t.Fatalf("expected at most 1 renewal call during Close, got %d", n)
		}
	})
}

// Bug (b): a manual Renew in flight when the local guard fired returned nil,
// and the store kept the lock for a whole TTL under a token nobody held.
func TestRenewRacingTheGuardReturnsTheCauseAndLeavesNoLock(t *testing.T) {
	t.Run("manual", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memstore.New()
			ops := countOps(store, nil)
			a, _, _ := newLocker(t, store, leasehold.Options{Name: "a"})
			b, _, _ := newLocker(t, store, leasehold.Options{Name: "b"})
			lease, err := a.Hold(t.Context(), "k", time.Second) // guard at 945 ms
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(900 * time.Millisecond)
			// The renewal reaches the store at 980 ms: after the guard, before
			// the store's expiry at 1 s, so the store applies it.
			failRenewals(ops, 80*time.Millisecond)
			if err := lease.Renew(t.Context()); !errors.Is(err, leasehold.ErrLeaseExpired) {
				t.Fatalf("expected the lease's cause ErrLeaseExpired from a Renew the guard overtook, got %v", err)
			}
			ops.setFail(nil)
			if _, err := store.Inspect(t.Context(), "k"); !errors.Is(err, leasehold.ErrNotHeld) {
				t.Fatalf("expected the late renewal undone (no lock), got %v", err)
			}
			if _, err := b.Hold(t.Context(), "k", time.Second); err != nil {
				t.Fatalf("expected another owner to take the key at once, got %v", err)
			}
		})
	})
	t.Run("automatic", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memstore.New()
			ops := countOps(store, nil)
			l, _, _ := newLocker(t, store, leasehold.Options{TTL: time.Second, RenewInterval: 300 * time.Millisecond, RenewTimeout: 900 * time.Millisecond})
			lease, err := l.TryAcquire(t.Context(), "k")
			if err != nil {
				t.Fatal(err)
			}
			failRenewals(ops, 680*time.Millisecond) // sent at 300 ms, applied at 980 ms
			<-lease.Done()
			if cause := context.Cause(lease.Context()); !errors.Is(cause, leasehold.ErrLeaseExpired) {
				t.Fatalf("expected ErrLeaseExpired, got %v", cause)
			}
			time.Sleep(40 * time.Millisecond) // the renewal lands at 980 ms
			synctest.Wait()
			if _, err := store.Inspect(t.Context(), "k"); !errors.Is(err, leasehold.ErrNotHeld) {
				t.Fatalf("expected the renewal that landed after the guard undone, got %v", err)
			}
		})
	})
}

// Bug (c): with the default options a lease whose renewals keep failing must
// be ended by its failure budget, not by the local guard.
func TestFailureBudgetIsReachedWithDefaults(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ttl   time.Duration
		stall time.Duration // 0: fail at once; else every attempt times out
	}{
		{"default TTL, failing fast", 0, 0},
		{"default TTL, timing out", 0, time.Hour},
		{"TTL 3s, failing fast", 3 * time.Second, 0},
		{"TTL 3s, timing out", 3 * time.Second, time.Hour},
		{"TTL 200ms, timing out", 200 * time.Millisecond, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memstore.New()
				ops := countOps(store, nil)
				logs := &syncBuffer{}
				l, rec, _ := newLocker(t, store, leasehold.Options{TTL: tc.ttl, Logger: slogTo(logs)})
				if strings.Contains(logs.String(), "budget") {
					t.Fatalf("expected no budget warning for default options, got %s", logs)
				}
				lease, err := l.TryAcquire(t.Context(), "k")
				if err != nil {
					t.Fatal(err)
				}
				failRenewals(ops, tc.stall)
				<-lease.Done()
				if cause := context.Cause(lease.Context()); !errors.Is(cause, leasehold.ErrLeaseAbandoned) {
					t.Fatalf("expected ErrLeaseAbandoned, got %v", cause)
				}
				if n := rec.count(leasehold.EventRenewFailed); n != leasehold.DefaultMaxRenewFailures {
					t.Fatalf("expected %d failed attempts, got %d", leasehold.DefaultMaxRenewFailures, n)
				}
			})
		})
	}
}

func TestBudgetOfDefaultsFits(t *testing.T) {
	for _, ttl := range []time.Duration{100 * time.Millisecond, time.Second, 3 * time.Second, 30 * time.Second, time.Hour} {
		b, err := leasehold.Options{TTL: ttl}.Budget()
		if err != nil {
			t.Fatal(err)
		}
		if !b.Fits() {
			t.Errorf("TTL %v: expected the default budget to fit, need %v, have %v", ttl, b.Need(), b.Have())
		}
	}
	b, err := leasehold.Options{TTL: time.Second, RenewInterval: 500 * time.Millisecond, RenewTimeout: 200 * time.Millisecond}.Budget()
	if err != nil || b.Fits() {
		t.Fatalf("expected a budget that does not fit (need %v, have %v), got fits=%v, %v", b.Need(), b.Have(), b.Fits(), err)
	}
}

// Bug (d): a successful manual Renew must reset the count of consecutive
// failed automatic renewals.
func TestManualRenewResetsFailureCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		ops := countOps(store, nil)
		l, rec, _ := newLocker(t, store, leasehold.Options{TTL: 3 * time.Second})
		lease, err := l.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		failRenewals(ops, 0)
		for rec.count(leasehold.EventRenewFailed) < 2 {
			time.Sleep(time.Millisecond)
		}
		ops.setFail(nil)
		if err := lease.Renew(t.Context()); err != nil {
			t.Fatal(err)
		}
		failRenewals(ops, 0)
		<-lease.Done()
		if cause := context.Cause(lease.Context()); !errors.Is(cause, leasehold.ErrLeaseAbandoned) {
			t.Fatalf("expected ErrLeaseAbandoned, got %v", cause)
		}
		if n := rec.count(leasehold.EventRenewFailed); n != 2+3 {
			t.Fatalf("expected a full budget of 3 failures after the manual renewal (5 in all), got %d", n)
		}
	})
}

// Bug (f): an observer or log call about a lease that the guard ended must
// not still run after Release or Close returned.
func TestNoReportRunsAfterReleaseOrCloseReturned(t *testing.T) {
	for _, via := range []string{"Release", "Close"} {
		t.Run(via, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memstore.New()
				ops := countOps(store, nil)
				entered := make(chan struct{})
				var finished atomic.Bool
				var once sync.Once
				obs := leasehold.ObserverFunc(func(e leasehold.Event) {
					if e.Kind == leasehold.EventExpired {
						once.Do(func() { close(entered) })
						time.Sleep(100 * time.Millisecond) // a slow observer
						finished.Store(true)
					}
				})
				l, _, _ := newLocker(t, store, leasehold.Options{TTL: time.Second, RenewInterval: 300 * time.Millisecond,
					RenewTimeout: 900 * time.Millisecond, MaxRenewFailures: 1, Observer: obs})
				lease, err := l.TryAcquire(t.Context(), "k")
				if err != nil {
					t.Fatal(err)
				}
				failRenewals(ops, time.Hour) // the renewal at 300 ms hangs past the guard
				<-entered
				if via == "Release" {
					_ = lease.Release(t.Context())
				} else {
					_ = l.Close()
				}
				if !finished.Load() {
					t.Fatalf("expected the guard's observer call finished when %s returned", via)
				}
			})
		})
	}
}

// Bug (g): absurd renewal intervals are rejected, naming the option.
func TestRenewIntervalHasAFloor(t *testing.T) {
	for _, d := range []time.Duration{time.Nanosecond, time.Millisecond} {
		_, err := leasehold.New(memstore.New(), leasehold.Options{TTL: time.Second, RenewInterval: d})
		if !errors.Is(err, leasehold.ErrInvalidOptions) || !strings.Contains(err.Error(), "RenewInterval") || !strings.Contains(err.Error(), "MinRenewInterval") {
			t.Fatalf("RenewInterval %v: expected ErrInvalidOptions naming RenewInterval and its floor, got %v", d, err)
		}
	}
}

// A thousand held leases add no goroutine: one scheduler renews them all.
func TestHeldLeasesAddNoGoroutines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		ops := countOps(store, nil)
		l, rec, _ := newLocker(t, store, leasehold.Options{TTL: time.Second})
		first := acquireMany(t, l, 1)
		synctest.Wait()
		base := countGoroutines()
		if base != 1 {
			t.Fatalf("expected one goroutine (the scheduler) for a held lease, got %d", base)
		}
		leases := first
		for i := range 999 {
			ls, err := l.TryAcquire(t.Context(), "many:"+itoa(i))
			if err != nil {
				t.Fatal(err)
			}
			leases = append(leases, ls)
		}
		synctest.Wait()
		if n := countGoroutines(); n != base {
			t.Fatalf("expected 1,000 held leases to add no goroutine, %d then %d", base, n)
		}
		time.Sleep(2 * time.Second) // six renewals each
		synctest.Wait()
		if n := countGoroutines(); n != base {
			t.Fatalf("expected no goroutine left after renewals, %d then %d", base, n)
		}
		if err := first[0].Err(); err != nil {
			t.Fatal(err)
		}
		for _, ls := range leases {
			_ = ls.Release(t.Context())
		}
		time.Sleep(time.Second) // the scheduler lingers a little for the next lease
		synctest.Wait()
		if n := countGoroutines(); n != 0 {
			t.Fatalf("expected no goroutine once every lease is released, got %d", n)
		}
		renewed := rec.count(leasehold.EventRenewed)
		trips := ops.get(memstore.OpRenew) + ops.get(memstore.OpRenewBatch)
		t.Logf("%d renewals in %d round trips", renewed, trips)
		if renewed < 5000 || trips*100 > renewed {
			t.Fatalf("expected about 6,000 renewals in batches, got %d renewals in %d round trips", renewed, trips)
		}
	})
}

// Close releases many leases over a slow store a batch at a time, not one
// ReleaseTimeout after another, and waits for all of them.
func TestCloseReleasesInParallel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		ops := countOps(store, nil)
		l, err := leasehold.New(store, leasehold.Options{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		acquireMany(t, l, 64)
		ops.setFail(func(op memstore.Op, _ string) memstore.Fault {
			if op == memstore.OpRelease {
				return memstore.Fault{Delay: time.Second}
			}
			return memstore.Fault{}
		})
		start := time.Now()
		_ = l.Close()
		if d := time.Since(start); d > 4*time.Second {
			t.Fatalf("expected Close to release 64 slow locks 16 at a time (4s), took %v", d)
		}
		if n := ops.get(memstore.OpRelease); n != 64 {
			t.Fatalf("expected 64 releases, got %d", n)
		}
		store.SetFaults(nil)
		if infos, _ := store.List(t.Context(), ""); len(infos) != 0 {
			t.Fatalf("expected every lock released, %d left", len(infos))
		}
	})
}

// A renewal that hangs, ignoring its deadline, delays no other lease's
// guard: store calls never run on the scheduler's goroutine.
func TestHungRenewalDelaysNoOtherGuard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &deafStore{Store: memstore.New(), done: make(chan struct{})}
		defer close(store.done)
		l, _, _ := newLocker(t, store, leasehold.Options{TTL: time.Second, RenewInterval: 100 * time.Millisecond, MaxRenewFailures: 100})
		if _, err := l.TryAcquire(t.Context(), "renewed"); err != nil {
			t.Fatal(err)
		}
		store.mu.Lock()
		store.deaf = true // every renewal from now on hangs for 2 s
		store.mu.Unlock()
		time.Sleep(150 * time.Millisecond) // the renewal at 100 ms hangs
		hold, err := l.Hold(t.Context(), "held", 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		<-hold.Done()
		if d, want := time.Since(start), 500*time.Millisecond-calibrate.DriftMargin(500*time.Millisecond); d != want {
			t.Fatalf("expected the hold's guard exactly at %v, fired after %v", want, d)
		}
	})
}
