package leasehold_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
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
	}
}

func TestLocalGateSendsOneStoreRequestPerKey(t *testing.T) {
	store := memstore.New()
	ops := countOps(store, nil)
	l, rec, _ := newLocker(t, store, leasehold.Options{TTL: 5 * time.Second})
	lease, err := l.TryAcquire(t.Context(), "k")
	if err != nil {
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
}

func TestStaleReleaseAfterExpiryLeavesNewOwner(t *testing.T) {
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
}

func TestRenewAfterExpiryFailsAndLosesLease(t *testing.T) {
	clock := newFakeClock()
	store := memstore.New(memstore.WithClock(clock.Now))
	l, rec, _ := newLocker(t, store, leasehold.Options{TTL: time.Minute})
	lease, err := l.TryAcquire(t.Context(), "job")
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(61 * time.Second)
	if err := lease.Renew(t.Context()); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("expected ErrNotOwned, got %v", err)
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, leasehold.ErrLeaseLost) {
		t.Fatalf("expected cause ErrLeaseLost, got %v", cause)
	}
	if n := rec.count(leasehold.EventNotOwned); n != 1 {
		t.Fatalf("expected 1 not-owned event, got %d", n)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatalf("expected release after loss to be a no-op, got %v", err)
	}
}

func TestAbandonAfterExactlyMaxRenewFailuresSkipsRelease(t *testing.T) {
	store := memstore.New()
	ops := countOps(store, nil)
	l, rec, logs := newLocker(t, store, leasehold.Options{
		TTL: 2 * time.Second, RenewInterval: 30 * time.Millisecond, MaxRenewFailures: 3,
	})
	lease, err := l.TryAcquire(t.Context(), "job")
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("connection reset")
	ops.setFail(func(op memstore.Op, _ string) memstore.Fault {
		if op == memstore.OpRenew || op == memstore.OpRenewBatch {
			return memstore.Fault{Err: boom}
		}
		return memstore.Fault{}
	})
	waitDone(t, lease.Context(), 2*time.Second, "lease context")
	if cause := context.Cause(lease.Context()); !errors.Is(cause, leasehold.ErrLeaseAbandoned) {
		t.Fatalf("expected cause ErrLeaseAbandoned, got %v", cause)
	}
	time.Sleep(100 * time.Millisecond) // renewal must have stopped
	if n := ops.get(memstore.OpRenew); n != 3 {
		t.Fatalf("expected exactly 3 renew attempts, got %d", n)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatalf("expected nil from release after abandonment, got %v", err)
	}
	if n := ops.get(memstore.OpRelease); n != 0 {
		t.Fatalf("expected release to be skipped after abandonment, got %d store releases", n)
	}
	if _, err := store.Inspect(t.Context(), "job"); err != nil {
		t.Fatalf("expected the abandoned lock to stay until its TTL, got %v", err)
	}
	if n := rec.count(leasehold.EventAbandoned); n != 1 {
		t.Fatalf("expected 1 abandoned event, got %d", n)
	}
	if n := rec.count(leasehold.EventRenewFailed); n != 3 {
		t.Fatalf("expected 3 renew-failed events, got %d", n)
	}
	if n := logs.count("leasehold: lease abandoned"); n != 1 {
		t.Fatalf("expected one abandonment log line, got %d in %s", n, logs)
	}
}

func TestNotOwnedRenewCancelsAtOnce(t *testing.T) {
	store := memstore.New()
	ops := countOps(store, nil)
	l, rec, _ := newLocker(t, store, leasehold.Options{TTL: 2 * time.Second, RenewInterval: 30 * time.Millisecond})
	lease, err := l.TryAcquire(t.Context(), "job")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(80 * time.Millisecond) // a few good renewals
	before := ops.get(memstore.OpRenew)
	if before == 0 {
		t.Fatal("expected renewals before the break-in")
	}
	if _, err := store.ForceRelease(t.Context(), "job"); err != nil {
		t.Fatal(err)
	}
	waitDone(t, lease.Context(), time.Second, "lease context")
	if cause := context.Cause(lease.Context()); !errors.Is(cause, leasehold.ErrLeaseLost) {
		t.Fatalf("expected cause ErrLeaseLost, got %v", cause)
	}
	time.Sleep(100 * time.Millisecond)
	if n := ops.get(memstore.OpRenew) - before; n != 1 {
		t.Fatalf("expected exactly 1 renew after the lock was taken away, got %d", n)
	}
	if rec.count(leasehold.EventLost) != 1 || rec.count(leasehold.EventNotOwned) != 1 {
		t.Fatalf("expected 1 lost and 1 not-owned event, got %d and %d", rec.count(leasehold.EventLost), rec.count(leasehold.EventNotOwned))
	}
}

func TestContinuePolicyKeepsGoingAndCounts(t *testing.T) {
	store := memstore.New()
	ops := countOps(store, nil)
	l, rec, logs := newLocker(t, store, leasehold.Options{
		TTL: 200 * time.Millisecond, RenewInterval: 20 * time.Millisecond,
		OnRenewFailure: leasehold.RenewalContinue,
	})
	lease, err := l.TryAcquire(t.Context(), "job")
	if err != nil {
		t.Fatal(err)
	}
	ops.setFail(func(op memstore.Op, _ string) memstore.Fault {
		if op == memstore.OpRenew || op == memstore.OpRenewBatch {
			return memstore.Fault{Err: memstore.ErrUnavailable}
		}
		return memstore.Fault{}
	})
	time.Sleep(400 * time.Millisecond) // well past the TTL and past 3 failures
	if err := lease.Err(); err != nil {
		t.Fatalf("expected the Continue policy to keep the lease context alive, got %v", err)
	}
	if n := rec.count(leasehold.EventRenewFailed); n < 5 {
		t.Fatalf("expected at least 5 counted renewal failures, got %d", n)
	}
	if n := rec.count(leasehold.EventAbandoned); n != 0 {
		t.Fatalf("expected no abandonment under Continue, got %d", n)
	}
	if logs.count("leasehold: lease renewal failed") < 5 {
		t.Fatalf("expected renewal failures to be logged, got %s", logs)
	}
	ops.setFail(nil)
	if err := lease.Release(t.Context()); err != nil && !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("release: %v", err)
	}
}

func TestStoreFailurePolicy(t *testing.T) {
	t.Run("fail-closed returns the store error", func(t *testing.T) {
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
	t.Run("fail-open returns a degraded local lease", func(t *testing.T) {
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
	t.Run("contention never fails open", func(t *testing.T) {
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

func TestLocalGuardFiresBeforeStoreExpiryEvenWithLargeBudget(t *testing.T) {
	store := memstore.New()
	ops := countOps(store, nil)
	const ttl = 300 * time.Millisecond
	l, rec, _ := newLocker(t, store, leasehold.Options{
		TTL: ttl, RenewInterval: 20 * time.Millisecond, MaxRenewFailures: 1000,
	})
	ops.setFail(func(op memstore.Op, _ string) memstore.Fault {
		if op == memstore.OpRenew || op == memstore.OpRenewBatch {
			return memstore.Fault{Delay: time.Hour} // stalls until the attempt's timeout
		}
		return memstore.Fault{}
	})
	start := time.Now()
	lease, err := l.TryAcquire(t.Context(), "job")
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, lease.Context(), 2*time.Second, "lease context")
	elapsed := time.Since(start)
	if _, err := store.Inspect(t.Context(), "job"); err != nil {
		t.Fatalf("expected the store to still hold the key when the holder learned of expiry, got %v", err)
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, leasehold.ErrLeaseExpired) {
		t.Fatalf("expected cause ErrLeaseExpired, got %v", cause)
	}
	if elapsed > ttl {
		t.Fatalf("expected cancellation before the TTL (%v), got %v", ttl, elapsed)
	}
	if rec.count(leasehold.EventAbandoned) != 0 || rec.count(leasehold.EventExpired) != 1 {
		t.Fatalf("expected 1 expired and 0 abandoned events, got %d and %d", rec.count(leasehold.EventExpired), rec.count(leasehold.EventAbandoned))
	}
}

// TestHolderLearnsOfLossBeforeStoreExpiry runs thousands of leases whose
// renewals all fail and checks, for every one, that the holder's context was
// cancelled before the store-side expiry: the store's own acquisition time
// (memstore reports it in LockInfo.Facts) plus the TTL.
func TestHolderLearnsOfLossBeforeStoreExpiry(t *testing.T) {
	const trials = 2000
	const ttl = 2 * time.Second
	store := memstore.New()
	store.SetFaults(func(op memstore.Op, _ string) memstore.Fault {
		if op == memstore.OpRenew || op == memstore.OpRenewBatch {
			return memstore.Fault{Err: memstore.ErrUnavailable}
		}
		return memstore.Fault{}
	})
	var mu sync.Mutex
	cancelledAt := map[string]time.Time{}
	obs := leasehold.ObserverFunc(func(e leasehold.Event) {
		if e.Kind == leasehold.EventHeld {
			now := time.Now()
			mu.Lock()
			cancelledAt[e.Key] = now
			mu.Unlock()
		}
	})
	// The margin must cover the holder's scheduling delay: on a 2-core CI
	// machine running every test package and three servers at once, timer
	// wake-ups were seen up to ~100 ms late, so this test gives it 400 ms.
	l, _, _ := newLocker(t, store, leasehold.Options{TTL: ttl, DriftMargin: ttl / 5, MaxRenewFailures: 100, Observer: obs})
	var late, guardAfterExpiry atomic.Int32
	var lateMu sync.Mutex
	var lateness []time.Duration
	var worst atomic.Int64 // smallest slack between cancel and store expiry, ns
	worst.Store(int64(time.Hour))
	var wg sync.WaitGroup
	for i := range trials {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "trial:" + strconv.Itoa(i)
			lease, err := l.TryAcquire(context.Background(), key)
			if err != nil {
				t.Errorf("acquire %s: %v", key, err)
				return
			}
			info, err := store.Inspect(context.Background(), key)
			if err != nil {
				t.Errorf("inspect %s: %v", key, err)
				return
			}
			storeAcquired, err := time.Parse(time.RFC3339Nano, info.Facts["acquired"])
			if err != nil {
				t.Errorf("parse %q: %v", info.Facts["acquired"], err)
				return
			}
			expiry := storeAcquired.Add(ttl)
			if !lease.ValidUntil().Round(0).Before(expiry) {
				guardAfterExpiry.Add(1)
			}
			<-lease.Done()
			mu.Lock()
			at := cancelledAt[key]
			mu.Unlock()
			slack := expiry.Sub(at.Round(0))
			lateMu.Lock()
			lateness = append(lateness, at.Sub(lease.ValidUntil()))
			lateMu.Unlock()
			for {
				w := worst.Load()
				if int64(slack) >= w || worst.CompareAndSwap(w, int64(slack)) {
					break
				}
			}
			if slack <= 0 {
				late.Add(1)
			}
		}()
		// Spread the trials so that expiries do not all fire at the same
		// instant: a herd of simultaneous timers measures the scheduler, not
		// the guard.
		time.Sleep(2 * time.Millisecond)
	}
	wg.Wait()
	slices.Sort(lateness)
	t.Logf("%d trials, smallest margin between holder cancel and store expiry: %v; guard timer lateness p50 %v p99 %v max %v",
		trials, time.Duration(worst.Load()), lateness[len(lateness)/2], lateness[len(lateness)*99/100], lateness[len(lateness)-1])
	if n := guardAfterExpiry.Load(); n != 0 {
		t.Fatalf("expected the guard deadline before the store expiry every time, %d of %d were not", n, trials)
	}
	if n := late.Load(); n != 0 {
		t.Fatalf("expected every holder to be cancelled before the store expired the key, %d of %d were not", n, trials)
	}
}

func TestMaxHoldStopsRenewal(t *testing.T) {
	store := memstore.New()
	ops := countOps(store, nil)
	l, rec, _ := newLocker(t, store, leasehold.Options{
		TTL: 300 * time.Millisecond, RenewInterval: 50 * time.Millisecond, MaxHold: 200 * time.Millisecond,
	})
	start := time.Now()
	lease, err := l.TryAcquire(t.Context(), "job")
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, lease.Context(), 2*time.Second, "lease context")
	if cause := context.Cause(lease.Context()); !errors.Is(cause, leasehold.ErrMaxHoldReached) {
		t.Fatalf("expected cause ErrMaxHoldReached, got %v", cause)
	}
	if e := time.Since(start); e < 200*time.Millisecond {
		t.Fatalf("expected max hold after 200ms, got %v", e)
	}
	renewals := ops.get(memstore.OpRenew)
	time.Sleep(150 * time.Millisecond)
	if n := ops.get(memstore.OpRenew); n != renewals {
		t.Fatalf("expected renewal to stop at max hold, got %d more", n-renewals)
	}
	if err := lease.Renew(t.Context()); !errors.Is(err, leasehold.ErrMaxHoldReached) {
		t.Fatalf("expected manual renew to be refused after max hold, got %v", err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatalf("expected release after max hold to delete our lock, got %v", err)
	}
	if _, err := store.Inspect(t.Context(), "job"); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("expected ErrNotHeld after release, got %v", err)
	}
	if rec.count(leasehold.EventMaxHold) != 1 {
		t.Fatalf("expected 1 max-hold event, got %d", rec.count(leasehold.EventMaxHold))
	}
}

func TestHoldDoesNotReleaseAndExpiryRotatesOwnership(t *testing.T) {
	store := memstore.New()
	ops := countOps(store, nil)
	a, _, _ := newLocker(t, store, leasehold.Options{Name: "a"})
	b, _, _ := newLocker(t, store, leasehold.Options{Name: "b"})
	la, err := a.Hold(t.Context(), "reconciler", 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Hold(t.Context(), "reconciler", 200*time.Millisecond); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired while A holds, got %v", err)
	}
	waitDone(t, la.Context(), time.Second, "hold lease")
	if cause := context.Cause(la.Context()); !errors.Is(cause, leasehold.ErrLeaseExpired) {
		t.Fatalf("expected cause ErrLeaseExpired, got %v", cause)
	}
	if n := ops.get(memstore.OpRenew) + ops.get(memstore.OpRelease); n != 0 {
		t.Fatalf("expected a hold to never renew or release, got %d calls", n)
	}
	lb, err := b.Acquire(withTimeout(t, 2*time.Second), "reconciler")
	if err != nil {
		t.Fatalf("expected B to take over after A's TTL, got %v", err)
	}
	if lb.Fence() <= la.Fence() {
		t.Fatalf("expected fence > %d, got %d", la.Fence(), lb.Fence())
	}
	_ = lb.Release(t.Context())
}

func withTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestFencesIncreaseAcrossExpiryReleaseAndRestart(t *testing.T) {
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
}

func TestAcquireWaitsForReleaseNotification(t *testing.T) {
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
}

func TestAcquireTakesOverAfterCrashedHolderTTL(t *testing.T) {
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
}

func TestAcquireGivesUpWithBothCauses(t *testing.T) {
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
}

func TestDo(t *testing.T) {
	t.Run("runs and releases", func(t *testing.T) {
		store := memstore.New()
		l, _, _ := newLocker(t, store, leasehold.Options{})
		var fence uint64
		err := l.Do(t.Context(), "job:1", func(ctx context.Context, ls *leasehold.Lease) error {
			fence = ls.Fence()
			if _, err := store.Inspect(ctx, "job:1"); err != nil {
				t.Errorf("expected the lock held inside Do, got %v", err)
			}
			return nil
		})
		if err != nil || fence == 0 {
			t.Fatalf("expected success with a fence, got %v, %d", err, fence)
		}
		if _, err := store.Inspect(t.Context(), "job:1"); !errors.Is(err, leasehold.ErrNotHeld) {
			t.Fatalf("expected release after Do, got %v", err)
		}
	})
	t.Run("returns fn's error and releases on panic", func(t *testing.T) {
		store := memstore.New()
		l, _, _ := newLocker(t, store, leasehold.Options{})
		boom := errors.New("boom")
		if err := l.Do(t.Context(), "j", func(context.Context, *leasehold.Lease) error { return boom }); !errors.Is(err, boom) {
			t.Fatalf("expected boom, got %v", err)
		}
		func() {
			defer func() { _ = recover() }()
			_ = l.Do(t.Context(), "j", func(context.Context, *leasehold.Lease) error { panic("x") })
		}()
		if _, err := store.Inspect(t.Context(), "j"); !errors.Is(err, leasehold.ErrNotHeld) {
			t.Fatalf("expected release after panic, got %v", err)
		}
	})
	t.Run("reports a lease lost while fn ran", func(t *testing.T) {
		store := memstore.New()
		l, _, _ := newLocker(t, store, leasehold.Options{TTL: time.Second, RenewInterval: 20 * time.Millisecond})
		err := l.Do(t.Context(), "j", func(ctx context.Context, _ *leasehold.Lease) error {
			if _, err := store.ForceRelease(ctx, "j"); err != nil {
				return err
			}
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), leasehold.ErrLeaseLost) {
				t.Errorf("expected fn's context cause ErrLeaseLost, got %v", context.Cause(ctx))
			}
			return nil
		})
		if !errors.Is(err, leasehold.ErrLeaseLost) {
			t.Fatalf("expected Do to report ErrLeaseLost, got %v", err)
		}
	})
}

func TestLoopKeepsContendingForever(t *testing.T) {
	store := memstore.New()
	const interval = 30 * time.Millisecond
	var active, last atomic.Int32
	var overlap atomic.Bool
	runs := make([]atomic.Int32, 2)
	cancels := make([]context.CancelFunc, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		l, _, _ := newLocker(t, store, leasehold.Options{Name: "reconciler", TTL: 5 * interval})
		ctx, cancel := context.WithCancel(t.Context())
		cancels[i] = cancel
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := l.Loop(ctx, "reconcile", interval, func(context.Context, *leasehold.Lease) error {
				if active.Add(1) > 1 {
					overlap.Store(true)
				}
				runs[i].Add(1)
				last.Store(int32(i))
				time.Sleep(time.Millisecond)
				active.Add(-1)
				return errors.New("reconcile failed; the loop goes on")
			})
			if !errors.Is(err, context.Canceled) {
				t.Errorf("expected Loop to return the context's error, got %v", err)
			}
		}()
	}
	total := func() int32 { return runs[0].Load() + runs[1].Load() }
	time.Sleep(200 * time.Millisecond)
	if total() < 3 {
		t.Fatalf("expected the loop to run the function every interval, got %d runs", total())
	}
	// A store outage makes the leader lose its lease (renewals fail until the
	// local guard fires); once the store is back the loops contend again.
	store.SetDown(true)
	time.Sleep(10 * interval)
	store.SetDown(false)
	before := total()
	time.Sleep(300 * time.Millisecond)
	if total() == before {
		t.Fatal("expected a replica to hold the lease again after the outage")
	}
	// Stop the current leader: the other one takes over.
	leader := int(last.Load())
	cancels[leader]()
	time.Sleep(50 * time.Millisecond)
	follower := 1 - leader
	before = runs[follower].Load()
	time.Sleep(300 * time.Millisecond)
	if runs[follower].Load() == before {
		t.Fatalf("expected the other replica to take over after the leader stopped")
	}
	cancels[follower]()
	wg.Wait()
	if overlap.Load() {
		t.Fatal("expected no two replicas to run the function at once")
	}
}

func TestCloseCancelsAndReleasesEveryLease(t *testing.T) {
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
