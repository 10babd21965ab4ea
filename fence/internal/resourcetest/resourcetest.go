// Package resourcetest is the conformance suite every fence.Resource in this
// repository passes (Register, redisfence.Redis, pgfence.Table): the order
// rule at both boundaries, fence 0, concurrent writers, a holder paused past
// its TTL, a partitioned holder and a degraded lease, each with its events.
package resourcetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/memstore"
)

// Counter is an Observer that keeps every stale-write event.
type Counter struct {
	mu     sync.Mutex
	events []leasehold.Event
}

func (c *Counter) Observe(e leasehold.Event) {
	if e.Kind != leasehold.EventStaleWrite {
		return
	}
	c.mu.Lock()
	c.events = append(c.events, e)
	c.mu.Unlock()
}

// Stale returns the stale-write events observed so far.
func (c *Counter) Stale() []leasehold.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]leasehold.Event(nil), c.events...)
}

// Subject is a resource under test plus a way to read it back.
type Subject struct {
	Res      fence.Resource
	Read     func(ctx context.Context, key string) ([]byte, uint64, error)
	Obs      *Counter
	Resource string // expected Event.Op
}

// Factory makes a fresh, empty Subject reporting under locker name "approval".
type Factory func(t *testing.T) Subject

// Run checks the fence rule, its events and the interplay with real leases
// on fresh subjects from mk.
func Run(t *testing.T, mk Factory) {
	t.Run("Order", func(t *testing.T) { testOrder(t, mk(t)) })
	t.Run("NoFence", func(t *testing.T) { testNoFence(t, mk(t)) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, mk(t)) })
	t.Run("StaleWriterChaos", func(t *testing.T) { testChaos(t, mk(t)) })
	t.Run("PartitionedHolder", func(t *testing.T) { testPartitioned(t, mk(t)) })
	t.Run("DegradedLease", func(t *testing.T) { testDegraded(t, mk(t)) })
}

func mustRead(t *testing.T, s Subject, key string) (string, uint64) {
	t.Helper()
	v, f, err := s.Read(t.Context(), key)
	if err != nil {
		t.Fatalf("read %q: %v", key, err)
	}
	return string(v), f
}

func wantStale(t *testing.T, err error, fenceWant uint64) {
	t.Helper()
	if !errors.Is(err, fence.ErrStaleFence) {
		t.Fatalf("expected ErrStaleFence, got %v", err)
	}
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Fence != fenceWant {
		t.Fatalf("expected a *StaleError for fence %d, got %#v", fenceWant, err)
	}
}

// testOrder checks both boundaries of the rule: equal is accepted (a lease
// writes many times), lower is rejected, higher is accepted.
func testOrder(t *testing.T, s Subject) {
	ctx := t.Context()
	const key = "order"
	steps := []struct {
		fence uint64
		value string
		stale bool
	}{
		{10, "a", false}, // first write to an empty key
		{10, "b", false}, // equal: the same lease writes again
		{9, "c", true},   // lower by one: stale
		{1, "d", true},   // much lower: stale
		{11, "e", false}, // higher: the next holder
		{11, "f", false}, // equal again
		{10, "g", true},  // the previous holder, now stale
	}
	want, wantFence, rejected := "", uint64(0), 0
	for i, st := range steps {
		err := s.Res.Write(ctx, key, st.fence, []byte(st.value))
		if st.stale {
			wantStale(t, err, st.fence)
			rejected++
		} else {
			if err != nil {
				t.Fatalf("step %d: write fence %d: expected success, got %v", i, st.fence, err)
			}
			want, wantFence = st.value, st.fence
		}
		if v, f := mustRead(t, s, key); v != want || f != wantFence {
			t.Fatalf("step %d: expected %q@%d, got %q@%d", i, want, wantFence, v, f)
		}
	}
	var se *fence.StaleError
	err := s.Res.Write(ctx, key, 3, []byte("x"))
	rejected++
	if !errors.As(err, &se) || se.Current != 11 || se.Key != key || se.Resource != s.Resource {
		t.Fatalf("expected StaleError{Resource:%s Key:%s Fence:3 Current:11}, got %#v", s.Resource, key, se)
	}

	ev := s.Obs.Stale()
	if len(ev) != rejected {
		t.Fatalf("expected %d stale-write events, got %d", rejected, len(ev))
	}
	for _, e := range ev {
		if e.Kind != leasehold.EventStaleWrite || e.Locker != "approval" || e.Op != s.Resource || e.Key != key || e.Fence == 0 || e.Fence >= 11 {
			t.Fatalf("unexpected event %+v", e)
		}
	}
	if ev[0].Fence != 9 || ev[1].Fence != 1 {
		t.Fatalf("expected events for fences 9 then 1, got %d then %d", ev[0].Fence, ev[1].Fence)
	}

	// Keys are independent.
	if err := s.Res.Write(ctx, "other", 1, []byte("o")); err != nil {
		t.Fatalf("write to another key with a low fence: expected success, got %v", err)
	}
}

func testNoFence(t *testing.T, s Subject) {
	ctx := t.Context()
	if err := s.Res.Write(ctx, "zero", 0, []byte("x")); !errors.Is(err, fence.ErrNoFence) {
		t.Fatalf("expected ErrNoFence for fence 0, got %v", err)
	}
	if _, _, err := s.Read(ctx, "zero"); !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("expected nothing written for fence 0 (ErrNotFound), got %v", err)
	}
	if n := len(s.Obs.Stale()); n != 0 {
		t.Fatalf("expected no stale-write events for fence 0, got %d", n)
	}
}

// testConcurrent runs many writers with random fences at one key: the key
// must end at the highest fence with that writer's value, and every
// rejection must be both returned and reported.
func testConcurrent(t *testing.T, s Subject) {
	ctx := t.Context()
	const writers, writesEach = 50, 4
	var (
		wg       sync.WaitGroup
		rejected atomic.Int64
		maxFence atomic.Uint64
		ticket   atomic.Uint64
		errs     = make(chan error, writers*writesEach)
	)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range writesEach {
				// Mostly increasing fences with local reordering: both
				// concurrent accepts and stale rejections happen.
				f := ticket.Add(1) + 10 - rand.Uint64N(10)
				for {
					m := maxFence.Load()
					if f <= m || maxFence.CompareAndSwap(m, f) {
						break
					}
				}
				err := s.Res.Write(ctx, "hot", f, []byte(strconv.FormatUint(f, 10)))
				switch {
				case err == nil:
				case errors.Is(err, fence.ErrStaleFence):
					rejected.Add(1)
				default:
					errs <- fmt.Errorf("writer %d fence %d: %w", w, f, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	v, f := mustRead(t, s, "hot")
	if f != maxFence.Load() || v != strconv.FormatUint(f, 10) {
		t.Fatalf("expected the highest fence %d to win, got %q@%d", maxFence.Load(), v, f)
	}
	if n := int64(len(s.Obs.Stale())); n != rejected.Load() || n == 0 {
		t.Fatalf("expected one event per rejection (%d, > 0), got %d", rejected.Load(), n)
	}
	t.Logf("%d writes, %d rejected as stale, final fence %d", writers*writesEach, rejected.Load(), f)
}

// testChaos is the drill from the seeds: holder A pauses past its TTL,
// B takes over and writes, A wakes up and writes with its old fence.
func testChaos(t *testing.T, s Subject) {
	ctx := t.Context()
	store := memstore.New()
	lockA := newLocker(t, store, "replica-a")
	lockB := newLocker(t, store, "replica-b")
	const key, row = "scheduler:job:42", "job-42"

	a, err := lockA.Hold(ctx, key, 200*time.Millisecond)
	if err != nil {
		t.Fatalf("A acquire: %v", err)
	}
	if err := fence.Write(ctx, s.Res, a, row, []byte("A1")); err != nil {
		t.Fatalf("A's write while holding: %v", err)
	}

	// A pauses (a GC pause, a stalled VM) for longer than its TTL. Its
	// local guard fires on a timer, which a loaded machine runs late.
	time.Sleep(250 * time.Millisecond)
	select {
	case <-a.Done():
	case <-time.After(5 * time.Second):
	}
	if !errors.Is(a.Err(), leasehold.ErrLeaseExpired) {
		t.Fatalf("expected A's lease to have expired locally, got %v", a.Err())
	}

	b, err := lockB.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("B acquire after A's TTL: %v", err)
	}
	defer b.Release(ctx)
	if b.Fence() <= a.Fence() {
		t.Fatalf("expected B's fence > A's (%d), got %d", a.Fence(), b.Fence())
	}
	if err := fence.Write(ctx, s.Res, b, row, []byte("B1")); err != nil {
		t.Fatalf("B's write: %v", err)
	}

	// A wakes up and writes, twice, with its stale fence.
	wantStale(t, fence.Write(ctx, s.Res, a, row, []byte("A2")), a.Fence())
	wantStale(t, fence.Write(ctx, s.Res, a, row, []byte("A3")), a.Fence())
	if v, f := mustRead(t, s, row); v != "B1" || f != b.Fence() {
		t.Fatalf("expected B's data B1@%d, got %q@%d", b.Fence(), v, f)
	}

	// B writes again with the same fence: accepted.
	if err := fence.Write(ctx, s.Res, b, row, []byte("B2")); err != nil {
		t.Fatalf("B's second write with the same fence: %v", err)
	}
	if v, f := mustRead(t, s, row); v != "B2" || f != b.Fence() {
		t.Fatalf("expected B2@%d, got %q@%d", b.Fence(), v, f)
	}
	ev := s.Obs.Stale()
	if len(ev) != 2 || ev[0].Fence != a.Fence() || ev[1].Fence != a.Fence() {
		t.Fatalf("expected 2 stale-write events for A's fence %d, got %+v", a.Fence(), ev)
	}
}

// testPartitioned: A holds a renewed lease, loses the lock store (its
// renewals fail), ignores its lease's context and keeps working; B takes over
// after the TTL. A's writes are rejected.
func testPartitioned(t *testing.T, s Subject) {
	ctx := t.Context()
	store := memstore.New()
	lockA := newLocker(t, store, "replica-a")
	lockB := newLocker(t, store, "replica-b")
	const key, row = "wf:run:lock:7", "run-7"

	a, err := lockA.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("A acquire: %v", err)
	}
	defer a.Release(ctx)
	store.SetFaults(func(op memstore.Op, _ string) memstore.Fault {
		if op == memstore.OpRenew {
			return memstore.Fault{Err: errors.New("injected: partition")}
		}
		return memstore.Fault{}
	})
	select {
	case <-a.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("A's lease did not end while its renewals failed")
	}
	store.SetFaults(nil)
	t.Logf("A's lease ended: %v", context.Cause(a.Context()))

	var b *leasehold.Lease
	for deadline := time.Now().Add(5 * time.Second); b == nil; {
		if b, err = lockB.TryAcquire(ctx, key); err != nil {
			if !errors.Is(err, leasehold.ErrNotAcquired) || time.Now().After(deadline) {
				t.Fatalf("B acquire after A's TTL: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	defer b.Release(ctx)
	if err := fence.Write(ctx, s.Res, b, row, []byte("B")); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	wantStale(t, fence.Write(ctx, s.Res, a, row, []byte("A, unaware")), a.Fence())
	if v, f := mustRead(t, s, row); v != "B" || f != b.Fence() {
		t.Fatalf("expected B@%d, got %q@%d", b.Fence(), v, f)
	}
	if n := len(s.Obs.Stale()); n != 1 {
		t.Fatalf("expected 1 stale-write event, got %d", n)
	}
}

// testDegraded checks that a fail-open lease (fence 0) is refused.
func testDegraded(t *testing.T, s Subject) {
	ctx := t.Context()
	store := memstore.New()
	store.SetDown(true)
	l, err := leasehold.New(store, leasehold.Options{Name: "cleanup", TTL: time.Second, OnStoreError: leasehold.FailOpen, Logger: QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	lease, err := l.TryAcquire(ctx, "k")
	if err != nil || !lease.Degraded() {
		t.Fatalf("expected a degraded lease, got %v (%v)", lease, err)
	}
	defer lease.Release(ctx)
	if err := fence.Write(ctx, s.Res, lease, "degraded", []byte("x")); !errors.Is(err, fence.ErrNoFence) {
		t.Fatalf("expected ErrNoFence for a degraded lease, got %v", err)
	}
	if err := fence.Write(ctx, s.Res, nil, "degraded", []byte("x")); !errors.Is(err, fence.ErrNoFence) {
		t.Fatalf("expected ErrNoFence for a nil lease, got %v", err)
	}
	if _, _, err := s.Read(ctx, "degraded"); !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("expected nothing written (ErrNotFound), got %v", err)
	}
}

// QuietLogger discards everything.
func QuietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newLocker(t *testing.T, store driver.Store, name string) *leasehold.Locker {
	t.Helper()
	l, err := leasehold.New(store, leasehold.Options{Name: name, TTL: 200 * time.Millisecond, Logger: QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// BenchWrites alternates accepted writes (rising fence) and stale ones.
func BenchWrites(b *testing.B, r fence.Resource) {
	ctx := b.Context()
	value := []byte(`{"state":"done"}`)
	b.ReportAllocs()
	var f uint64 = 10
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			f++
		}
		fv := f - uint64(i%2) // odd iterations are stale
		_ = r.Write(ctx, "bench:"+strconv.Itoa(i%64), fv, value)
	}
}
