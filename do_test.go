package leasehold_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
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
		}, leasehold.WaitTimeout(2*time.Second))
		if err != nil {
			t.Fatalf("expected a 3s job to finish under a 2s wait bound, got %v", err)
		}

		if _, err := holder.Hold(t.Context(), "busy", time.Minute); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err = l.Do(t.Context(), "busy", func(context.Context, *leasehold.Lease) error { return nil }, leasehold.WaitTimeout(2*time.Second))
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
		err = l.Do(t.Context(), "job", func(context.Context, *leasehold.Lease) error { ran = true; return nil }, leasehold.TryOnce())
		if ran || !errors.Is(err, leasehold.ErrNotAcquired) || time.Since(start) != 0 {
			t.Fatalf("expected an immediate ErrNotAcquired without running, got ran=%v %v after %v", ran, err, time.Since(start))
		}
		calls := store.calls()
		if last := calls[len(calls)-1].req; last.QueueTTL != 0 {
			t.Fatalf("expected TryOnce not to queue, got QueueTTL %v", last.QueueTTL)
		}
		_ = held.Release(t.Context())
		if err := l.Do(t.Context(), "job", func(context.Context, *leasehold.Lease) error { ran = true; return nil }, leasehold.TryOnce()); err != nil || !ran {
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
