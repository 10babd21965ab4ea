package leasehold_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
)

// An uncontended TryAcquire + Release wakes no goroutine: a new lease whose
// first deadline is later than the one the scheduler's timer is armed for,
// and a released lease, leave the scheduler asleep. Each wake-up cost a
// thread wake on another core, 40-50 % of a Redis cycle at 1 goroutine.
func TestUncontendedCycleDoesNotWakeTheScheduler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _, _ := newLocker(t, memstore.New(), leasehold.Options{})
		cycle := func() {
			ls, err := l.TryAcquire(t.Context(), "k")
			if err != nil {
				t.Fatal(err)
			}
			if err := ls.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			synctest.Wait() // whatever the cycle woke has run
		}
		cycle() // starts the scheduler goroutine
		before := leasehold.SchedulerPasses(l)
		for range 100 {
			cycle()
		}
		if n := leasehold.SchedulerPasses(l) - before; n != 0 {
			t.Fatalf("expected 100 uncontended cycles to wake the scheduler 0 times, got %d", n)
		}
	})
}

// A lease whose first deadline is earlier than the scheduler's armed timer
// still wakes it, so the shorter deadline is kept: a short Hold after a long
// lease expires on time.
func TestEarlierDeadlineStillWakesTheScheduler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _, _ := newLocker(t, memstore.New(), leasehold.Options{})
		long, err := l.TryAcquire(t.Context(), "long")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = long.Release(context.Background()) }()
		synctest.Wait()
		short, err := l.Hold(t.Context(), "short", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		<-short.Done()
		if d := time.Since(start); d > time.Second {
			t.Fatalf("expected the hold to end before its 1s TTL, took %v", d)
		}
		if err := short.Err(); err != leasehold.ErrLeaseExpired {
			t.Fatalf("expected the hold to end with ErrLeaseExpired, got %v", err)
		}
		if err := long.Err(); err != nil {
			t.Fatalf("expected the long lease to be held, got %v", err)
		}
	})
}

// The Locker's own allocations per uncontended cycle stay few with a logger
// that drops debug records: building the lease's logger attributes for a
// debug record nobody writes cost 36 of 46 allocations per cycle.
func TestUncontendedCycleAllocations(t *testing.T) {
	lg := slog.New(slog.NewTextHandler(io.Discard, nil)) // Info: debug records dropped
	l, err := leasehold.New(memstore.New(), leasehold.Options{Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	allocs := testing.AllocsPerRun(200, func() {
		ls, err := l.TryAcquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%.1f allocations per cycle", allocs)
	if allocs > 16 {
		t.Fatalf("expected at most 16 allocations per TryAcquire + Release on memstore, got %.1f", allocs)
	}
}
