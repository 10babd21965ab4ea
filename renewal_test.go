package leasehold_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
)

func TestRenewAfterExpiryFailsAndLosesLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
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
	})
}

func TestAbandonAfterExactlyMaxRenewFailuresSkipsRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
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
	})
}

func TestNotOwnedRenewCancelsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
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
	})
}

func TestContinuePolicyKeepsGoingAndCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
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
	})
}

func TestLocalGuardFiresBeforeStoreExpiryEvenWithLargeBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
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
	})
}

// TestHolderLearnsOfLossBeforeStoreExpiry runs thousands of leases whose
// renewals all fail and checks, for every one, that the holder's context was
// cancelled before the store-side expiry: the store's own acquisition time
// (memstore reports it in LockInfo.Facts) plus the TTL.
func TestHolderLearnsOfLossBeforeStoreExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
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
	})
}

func TestMaxHoldStopsRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
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
	})
}

// A renewal in flight when MaxHold is reached that then fails schedules no
// retry: a capped lease is never renewed again. Before the fix the retry
// went out, and a retry that succeeded left renewAt in the past (extend
// moves no renewal of a capped lease), so the lease renewed in a tight loop
// until Release: a store storm that also kept the lock past the cap.
func TestRenewalFailingPastMaxHoldIsNotRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		ops := countOps(store, nil)
		l, _, _ := newLocker(t, store, leasehold.Options{
			TTL: 10 * time.Second, RenewInterval: 2 * time.Second, RenewTimeout: 500 * time.Millisecond, MaxHold: 4200 * time.Millisecond,
		})
		lease, err := l.TryAcquire(t.Context(), "job")
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(t.Context())
		time.Sleep(3 * time.Second)    // the renewal at 2 s went through
		failRenewals(ops, time.Second) // the one at 4 s times out at 4.5 s, after the cap at 4.2 s
		time.Sleep(2 * time.Second)
		failRenewals(ops, 0) // a retry would fail too, so that retries stay apart instead of looping
		renewals := ops.get(memstore.OpRenew)
		time.Sleep(4 * time.Second)
		if n := ops.get(memstore.OpRenew); n != renewals {
			t.Fatalf("expected no renewal after MaxHold, got %d more", n-renewals)
		}
	})
}

func TestHoldDoesNotReleaseAndExpiryRotatesOwnership(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
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
	})
}

// deafStore is a store whose Renew, once deaf, blocks for a long time and
// ignores its context's deadline, as a go-redis client without
// ContextTimeoutEnabled does on a dead connection.
type deafStore struct {
	*memstore.Store
	mu   sync.Mutex
	deaf bool
	done chan struct{}
}

func (d *deafStore) Renew(ctx context.Context, key, token string, ttl time.Duration) error {
	d.mu.Lock()
	deaf := d.deaf
	d.mu.Unlock()
	if deaf {
		select {
		case <-time.After(2 * time.Second):
		case <-d.done:
		}
		return errors.New("deaf: connection reset")
	}
	return d.Store.Renew(ctx, key, token, ttl)
}

func TestGuardFiresWhileARenewalIgnoresItsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &deafStore{Store: memstore.New(), done: make(chan struct{})}
		defer close(store.done)
		const ttl = 400 * time.Millisecond
		l, _, _ := newLocker(t, store, leasehold.Options{TTL: ttl, RenewInterval: 50 * time.Millisecond, MaxRenewFailures: 100})
		lease, err := l.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(120 * time.Millisecond) // a couple of good renewals
		store.mu.Lock()
		store.deaf = true
		store.mu.Unlock()
		deafAt := time.Now()
		waitDone(t, lease.Context(), 3*time.Second, "lease context")
		if cause := context.Cause(lease.Context()); !errors.Is(cause, leasehold.ErrLeaseExpired) {
			t.Fatalf("expected ErrLeaseExpired while the renewal hung, got %v", cause)
		}
		if el := time.Since(deafAt); el > ttl {
			t.Fatalf("expected the guard within the TTL (%v) of the last good renewal, fired %v after the store went deaf", ttl, el)
		}
		if _, err := store.Inspect(t.Context(), "k"); err != nil {
			t.Fatalf("expected the holder to learn of expiry before the store expired the key, got %v", err)
		}
	})
}

type runIDKey struct{}

// runIDHandler adds the run id found in a record's context, as a service's
// own slog handler would.
type runIDHandler struct{ slog.Handler }

func (h runIDHandler) Handle(ctx context.Context, r slog.Record) error {
	if id, ok := ctx.Value(runIDKey{}).(string); ok {
		r.AddAttrs(slog.String("run_id", id))
	}
	return h.Handler.Handle(ctx, r)
}

func (h runIDHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return runIDHandler{h.Handler.WithAttrs(as)}
}

func TestLogRecordsCarryTheAcquireContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		logs := &syncBuffer{}
		l, _, _ := newLocker(t, store, leasehold.Options{TTL: time.Second, RenewInterval: 20 * time.Millisecond,
			Logger: slog.New(runIDHandler{slog.NewTextHandler(logs, nil)})})
		ctx := context.WithValue(t.Context(), runIDKey{}, "run-7")
		lease, err := l.TryAcquire(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.ForceRelease(t.Context(), "job"); err != nil {
			t.Fatal(err)
		}
		waitDone(t, lease.Context(), time.Second, "lease")
		if !strings.Contains(logs.String(), "leasehold: lease lost") || !strings.Contains(logs.String(), "run_id=run-7") {
			t.Fatalf("expected the loss logged with the acquire context's run id, got %q", logs)
		}
	})
}
