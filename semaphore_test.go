package leasehold_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/memstore"
)

// TestSemaphoreAtMostN: six goroutines on three separate Lockers (three
// processes) share a semaphore of 2: never more than two run at once, both
// permits are used, and every permit has its own, increasing fence.
func TestSemaphoreAtMostN(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		var (
			running, most atomic.Int64
			mu            sync.Mutex
			fences        = map[uint64]bool{}
			wg            sync.WaitGroup
		)
		for i := range 3 {
			l, _, _ := newLocker(t, store, leasehold.Options{TTL: time.Second})
			sem, err := l.Semaphore("tenant:7", 2)
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 5 {
						err := sem.Do(t.Context(), func(ctx context.Context, p *leasehold.Lease) error {
							n := running.Add(1)
							defer running.Add(-1)
							for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
							}
							mu.Lock()
							if fences[p.Fence()] {
								t.Errorf("locker %d: fence %d granted twice", i, p.Fence())
							}
							fences[p.Fence()] = true
							mu.Unlock()
							time.Sleep(10 * time.Millisecond)
							return nil
						})
						if err != nil {
							t.Errorf("locker %d: Do: %v", i, err)
						}
					}
				}()
			}
		}
		wg.Wait()
		if m := most.Load(); m != 2 {
			t.Fatalf("expected at most and at least 2 concurrent holders, got %d", m)
		}
		if len(fences) != 30 {
			t.Fatalf("expected 30 distinct fences, got %d", len(fences))
		}
	})
}

// TestSemaphoreRenewedBesideALock: a permit and a lock held by one Locker
// over a store that batches renewals are both renewed past their TTL. A
// batch holding the permit must not go through RenewBatch (a lock renewal,
// which does not know the permit and would end it as lost).
func TestSemaphoreRenewedBesideALock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		l, _, _ := newLocker(t, store, leasehold.Options{TTL: 300 * time.Millisecond})
		sem, err := l.Semaphore("sem", 3)
		if err != nil {
			t.Fatal(err)
		}
		lock, err := l.TryAcquire(t.Context(), "lock")
		if err != nil {
			t.Fatal(err)
		}
		p1, err := sem.TryAcquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		p2, err := sem.TryAcquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		for _, ls := range []*leasehold.Lease{lock, p1, p2} {
			if err := ls.Err(); err != nil {
				t.Fatalf("%s: expected renewed and held after 2s, got %v", ls.Key(), err)
			}
		}
		info, err := sem.Permits(t.Context())
		if err != nil || len(info.Holders) != 2 || info.Holders[0].Fence != p1.Fence() {
			t.Fatalf("Permits: expected p1 and p2, got %+v, %v", info, err)
		}
		for _, ls := range []*leasehold.Lease{lock, p1, p2} {
			if err := ls.Release(t.Context()); err != nil {
				t.Fatalf("Release: %v", err)
			}
		}
		if info, _ := sem.Permits(t.Context()); len(info.Holders) != 0 {
			t.Fatalf("after release: expected no holders, got %+v", info)
		}
	})
}

// TestSemaphoreLostPermit: a permit the store no longer has (it lost its
// data) ends with ErrLeaseLost at the next renewal.
func TestSemaphoreLostPermit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		l, _, _ := newLocker(t, store, leasehold.Options{TTL: 300 * time.Millisecond})
		sem, _ := l.Semaphore("sem", 1)
		p, err := sem.TryAcquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		store.Restart()
		<-p.Done()
		if cause := context.Cause(p.Context()); !errors.Is(cause, leasehold.ErrLeaseLost) {
			t.Fatalf("expected ErrLeaseLost, got %v", cause)
		}
		if err := p.Release(t.Context()); err != nil {
			t.Fatalf("Release of a lost permit: expected nil, got %v", err)
		}
	})
}

// TestSemaphoreQueueAndLimit: waiters on separate Lockers are granted in
// the order they queued; lowering the limit revokes nobody and holds new
// permits back until the count is under it.
func TestSemaphoreQueueAndLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		holder, _, _ := newLocker(t, store, leasehold.Options{TTL: time.Minute})
		hs, _ := holder.Semaphore("q", 2)
		a, _ := hs.TryAcquire(t.Context())
		b, err := hs.TryAcquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var (
			mu    sync.Mutex
			order []int
			wg    sync.WaitGroup
		)
		for i := range 3 {
			l, _, _ := newLocker(t, store, leasehold.Options{TTL: time.Minute})
			sem, _ := l.Semaphore("q", 1) // the lowered limit
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := sem.Do(t.Context(), func(context.Context, *leasehold.Lease) error {
					mu.Lock()
					order = append(order, i)
					mu.Unlock()
					return nil
				})
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
				}
			}()
			synctest.Wait() // queued before the next one starts
		}
		if err := hs.SetLimit(1); err != nil {
			t.Fatal(err)
		}
		if _, err := hs.TryAcquire(t.Context()); !errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("TryAcquire with waiters queued: expected ErrNotAcquired, got %v", err)
		}
		if err := a.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if len(order) != 0 {
			t.Fatalf("granted %v while 1 of limit 1 is still held", order)
		}
		if err := b.Err(); err != nil {
			t.Fatalf("a holder after the limit was lowered: %v", err)
		}
		if err := b.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if fmt.Sprint(order) != "[0 1 2]" {
			t.Fatalf("expected grants in queue order [0 1 2], got %v", order)
		}
	})
}

func TestSemaphoreBadInput(t *testing.T) {
	l, _, _ := newLocker(t, memstore.New(), leasehold.Options{})
	if _, err := l.Semaphore("k", 0); !errors.Is(err, leasehold.ErrInvalidOptions) {
		t.Fatalf("limit 0: expected ErrInvalidOptions, got %v", err)
	}
	if _, err := l.Semaphore("", 1); !errors.Is(err, leasehold.ErrInvalidKey) {
		t.Fatalf("empty key: expected ErrInvalidKey, got %v", err)
	}
	type lockOnly struct{ driver.Store }
	l2, _, _ := newLocker(t, lockOnly{memstore.New()}, leasehold.Options{})
	if _, err := l2.Semaphore("k", 1); !errors.Is(err, leasehold.ErrInvalidOptions) {
		t.Fatalf("store without semaphores: expected ErrInvalidOptions, got %v", err)
	}
}
