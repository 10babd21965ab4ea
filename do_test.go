package leasehold_test

import (
	"context"
	"errors"
	"os"
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

func TestDoWaitTimeoutBoundsTheWaitNotTheWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		holder, _, _ := newLocker(t, store, leasehold.Options{Name: "holder"})
		l, _, _ := newLocker(t, store, leasehold.Options{Name: "worker"})
		if _, err := holder.Hold(t.Context(), "job", time.Second); err != nil {
			t.Fatal(err)
		}
		err := l.Do(t.Context(), "job", func(ctx context.Context, _ *leasehold.Lease) error {
			time.Sleep(3 * time.Second) // longer than the wait bound
			return ctx.Err()
		}, leasehold.DoOptions{WaitTimeout: 2 * time.Second})
		if err != nil {
			t.Fatalf("expected a 3s job to finish under a 2s wait bound, got %v", err)
		}

		if _, err := holder.Hold(t.Context(), "busy", time.Minute); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err = l.Do(t.Context(), "busy", func(context.Context, *leasehold.Lease) error { return nil }, leasehold.DoOptions{WaitTimeout: 2 * time.Second})
		if !errors.Is(err, leasehold.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("expected ErrNotAcquired and DeadlineExceeded, got %v", err)
		}
		if strings.Contains(err.Error(), "\n") {
			t.Fatalf("expected a one-line error, got %q", err)
		}
		if d := time.Since(start); d != 2*time.Second {
			t.Fatalf("expected to give up after the 2s wait bound, got %v", d)
		}
	})
}

func TestDoTryOnceSkipsWhenBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newRecordingStore()
		holder, _, _ := newLocker(t, store, leasehold.Options{Name: "holder"})
		l, _, _ := newLocker(t, store, leasehold.Options{Name: "worker"})
		held, err := holder.TryAcquire(t.Context(), "job")
		if err != nil {
			t.Fatal(err)
		}
		ran := false
		start := time.Now()
		err = l.Do(t.Context(), "job", func(context.Context, *leasehold.Lease) error { ran = true; return nil }, leasehold.DoOptions{TryOnce: true})
		if ran || !errors.Is(err, leasehold.ErrNotAcquired) || time.Since(start) != 0 {
			t.Fatalf("expected an immediate ErrNotAcquired without running, got ran=%v %v after %v", ran, err, time.Since(start))
		}
		calls := store.calls()
		if last := calls[len(calls)-1].req; last.QueueTTL != 0 {
			t.Fatalf("expected TryOnce not to queue, got QueueTTL %v", last.QueueTTL)
		}
		_ = held.Release(t.Context())
		if err := l.Do(t.Context(), "job", func(context.Context, *leasehold.Lease) error { ran = true; return nil }, leasehold.DoOptions{TryOnce: true}); err != nil || !ran {
			t.Fatalf("expected TryOnce to run on a free key, got ran=%v %v", ran, err)
		}
	})
}

func TestDoErrorsAreOneLineAndMatchEveryCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		l, _, _ := newLocker(t, store, leasehold.Options{TTL: time.Second})
		boom := errors.New("boom")
		err := l.Do(t.Context(), "j", func(ctx context.Context, _ *leasehold.Lease) error {
			if _, err := store.ForceRelease(ctx, "j"); err != nil {
				return err
			}
			<-ctx.Done()
			return boom
		})
		if !errors.Is(err, boom) || !errors.Is(err, leasehold.ErrLeaseLost) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("expected one line matching boom and ErrLeaseLost, got %q", err)
		}
		store.SetDown(true)
		err = l.Do(t.Context(), "j", func(context.Context, *leasehold.Lease) error { return nil })
		if !errors.Is(err, leasehold.ErrStore) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("expected one line matching ErrStore, got %q", err)
		}
	})
}

func TestIdentity(t *testing.T) {
	host, _ := os.Hostname()
	want := host + "/" + strconv.Itoa(os.Getpid())
	synctest.Test(t, func(t *testing.T) {
		store := newRecordingStore()
		l, _, logs := newLocker(t, store, leasehold.Options{TTL: time.Second})
		if got := l.Options().Identity; got != want {
			t.Fatalf("expected the default identity %q, got %q", want, got)
		}
		lease, err := l.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		if got := store.calls()[0].req.Holder; got != want {
			t.Fatalf("expected the identity sent as the holder, got %q", got)
		}
		_, _ = store.ForceRelease(t.Context(), "k")
		<-lease.Done()
		if !strings.Contains(logs.String(), "holder="+want) {
			t.Fatalf("expected the lease's log records to carry the holder, got %q", logs)
		}
	})
	for _, bad := range []string{"tab\there", "nul\x00", strings.Repeat("x", leasehold.MaxIdentityLen+1), "bad\xff"} {
		if _, err := leasehold.New(memstore.New(), leasehold.Options{Identity: bad}); !errors.Is(err, leasehold.ErrInvalidOptions) || !strings.Contains(err.Error(), "Identity") {
			t.Errorf("Identity %q: expected ErrInvalidOptions naming Identity, got %v", bad, err)
		}
	}
}

// Bug (e): Loop did not renew while fn ran, so a fn longer than the TTL was
// cancelled every cycle.
func TestLoopRenewsWhileFnRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		l, _, logs := newLocker(t, store, leasehold.Options{TTL: 2 * time.Second})
		ctx, cancel := context.WithTimeout(t.Context(), 7*time.Second)
		defer cancel()
		var runs, cut atomic.Int32
		err := l.Loop(ctx, "reconcile", time.Second, func(fnCtx context.Context, _ *leasehold.Lease) error {
			runs.Add(1)
			select {
			case <-time.After(3 * time.Second):
			case <-fnCtx.Done():
				if ctx.Err() == nil {
					cut.Add(1)
				}
			}
			return nil
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("expected the context's error, got %v", err)
		}
		if cut.Load() != 0 || strings.Contains(logs.String(), "expired") {
			t.Fatalf("expected fn never cut short while the replica owns the key, %d of %d runs were: %s", cut.Load(), runs.Load(), logs)
		}
		if runs.Load() < 2 {
			t.Fatalf("expected fn to run again after each run, got %d runs", runs.Load())
		}
	})
	for _, d := range []time.Duration{time.Nanosecond, 0, -time.Second, 3 * time.Second} {
		l, _, _ := newLocker(t, memstore.New(), leasehold.Options{TTL: 2 * time.Second})
		if err := l.Loop(t.Context(), "k", d, nil); !errors.Is(err, leasehold.ErrInvalidOptions) {
			t.Errorf("interval %v: expected ErrInvalidOptions, got %v", d, err)
		}
	}
}

func TestDo(t *testing.T) {
	t.Run("runs and releases", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
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
	})
	t.Run("returns fn's error and releases on panic", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
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
	})
	t.Run("reports a lease lost while fn ran", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
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
	})
}

func TestLoopKeepsContendingForever(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
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
	})
}

// Loop returns ErrLockerClosed once its Locker is closed, as Election.Run
// does, instead of trying to acquire (and warning) every interval until its
// context ends.
func TestLoopReturnsWhenTheLockerCloses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &syncBuffer{}
		l, err := leasehold.New(memstore.New(), leasehold.Options{Logger: slogTo(logs)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() {
			done <- l.Loop(ctx, "reconcile", time.Second, func(context.Context, *leasehold.Lease) error { return nil })
		}()
		time.Sleep(2500 * time.Millisecond)
		_ = l.Close()
		select {
		case err := <-done:
			if !errors.Is(err, leasehold.ErrLockerClosed) {
				t.Fatalf("expected ErrLockerClosed, got %v", err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("expected Loop to return when its Locker closed; logged: %s", logs)
		}
		if n := logs.count("loop could not acquire"); n != 0 {
			t.Fatalf("expected no acquire warning, got %d", n)
		}
	})
}
