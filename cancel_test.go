package leasehold_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/memstore"
)

// lateGrants is a memstore whose lock and permit acquires are applied and
// then, before the reply reaches the Locker, end the caller's context: a
// grant that raced the caller's giving up.
type lateGrants struct {
	*memstore.Store
	cancel context.CancelFunc
}

func (s *lateGrants) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := s.Store.Acquire(ctx, req)
	s.cancel()
	return g, err
}

func (s *lateGrants) AcquirePermit(ctx context.Context, req driver.PermitRequest) (driver.Grant, error) {
	g, err := s.Store.AcquirePermit(ctx, req)
	s.cancel()
	return g, err
}

// A caller whose context ended never gets a lease: a grant that raced the
// cancellation is released by the Locker, and the caller gets its context's
// error, through every entry point.
func TestGrantThatRacedCancellationIsReleased(t *testing.T) {
	calls := map[string]func(ctx context.Context, l *leasehold.Locker) (*leasehold.Lease, error){
		"TryAcquire": func(ctx context.Context, l *leasehold.Locker) (*leasehold.Lease, error) {
			return l.TryAcquire(ctx, "k")
		},
		"Acquire": func(ctx context.Context, l *leasehold.Locker) (*leasehold.Lease, error) { return l.Acquire(ctx, "k") },
		"Hold":    func(ctx context.Context, l *leasehold.Locker) (*leasehold.Lease, error) { return l.Hold(ctx, "k", 0) },
		"Do": func(ctx context.Context, l *leasehold.Locker) (*leasehold.Lease, error) {
			return nil, l.Do(ctx, "k", func(context.Context, *leasehold.Lease) error {
				t.Error("Do: fn ran for a caller whose context ended")
				return nil
			})
		},
		"Semaphore.Acquire": func(ctx context.Context, l *leasehold.Locker) (*leasehold.Lease, error) {
			sem, err := l.Semaphore("k", 1)
			if err != nil {
				t.Fatal(err)
			}
			return sem.Acquire(ctx)
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			for _, policy := range []leasehold.StorePolicy{leasehold.FailClosed, leasehold.FailOpen} {
				inner := memstore.New()
				ctx, cancel := context.WithCancel(t.Context())
				store := &lateGrants{Store: inner, cancel: cancel}
				l, _, _ := newLocker(t, store, leasehold.Options{TTL: time.Minute, OnStoreError: policy})
				lease, err := call(ctx, l)
				if lease != nil || !errors.Is(err, context.Canceled) {
					t.Fatalf("%v: expected no lease and an error matching context.Canceled, got lease=%v, %v", policy, lease != nil, err)
				}
				// The grant is released long before its TTL of a minute.
				deadline := time.Now().Add(5 * time.Second)
				for held(t, inner) {
					if time.Now().After(deadline) {
						t.Fatalf("%v: the grant is still held 5 s after the caller gave up (TTL 1 min)", policy)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
}

// held reports whether key "k" is held, as a lock or as a permit.
func held(t *testing.T, s *memstore.Store) bool {
	t.Helper()
	_, err := s.Inspect(t.Context(), "k")
	if err != nil && !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatal(err)
	}
	info, perr := s.Permits(t.Context(), "k")
	if perr != nil {
		t.Fatal(perr)
	}
	return err == nil || len(info.Holders) > 0
}

// #28 (3): under FailOpen, a store that fails after the caller's context
// ended (a dial timeout that outlives a cancelled acquire) gives the
// context's error, never a degraded lease.
func TestNoFailOpenAfterTheContextEnded(t *testing.T) {
	store := memstore.New()
	l, rec, _ := newLocker(t, store, leasehold.Options{OnStoreError: leasehold.FailOpen})
	for name, call := range map[string]func(context.Context) (*leasehold.Lease, error){
		"TryAcquire": func(ctx context.Context) (*leasehold.Lease, error) { return l.TryAcquire(ctx, "k") },
		"Acquire":    func(ctx context.Context) (*leasehold.Lease, error) { return l.Acquire(ctx, "k") },
	} {
		ctx, cancel := context.WithCancel(t.Context())
		store.SetFaults(func(op memstore.Op, _ string) memstore.Fault {
			if op != memstore.OpAcquire {
				return memstore.Fault{}
			}
			cancel() // the caller gives up while the store does not answer
			return memstore.Fault{Err: memstore.ErrUnavailable}
		})
		lease, err := call(ctx)
		if lease != nil || !errors.Is(err, context.Canceled) || !errors.Is(err, leasehold.ErrStore) {
			t.Fatalf("%s: expected no lease and an error matching context.Canceled and ErrStore, got lease=%v, %v", name, lease != nil, err)
		}
	}
	if n := rec.count(leasehold.EventFailOpen); n != 0 {
		t.Fatalf("expected no fail-open, got %d", n)
	}
}

// #27 (2): when Campaign wins just as Run's context ends, Run leaves
// nobody leading: the grant is released and OnStartedLeading never runs.
func TestElectionRunWonAsItsContextEndedLeavesNoLeader(t *testing.T) {
	inner := memstore.New()
	ctx, cancel := context.WithCancel(t.Context())
	l, _, _ := newLocker(t, &lateGrants{Store: inner, cancel: cancel}, leasehold.Options{TTL: time.Minute})
	e, err := leasehold.NewElection(l, "k", leasehold.Callbacks{
		OnStartedLeading: func(context.Context, *leasehold.Lease) { t.Error("OnStartedLeading ran after Run's context ended") },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("expected Run to return context.Canceled, got %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ld, err := e.Leader(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if ld.Vacant() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("expected no leader after Run returned, got %+v 5 s later (TTL 1 min)", ld)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// slowApply is a memstore that applies an acquire delay after it was sent,
// whether or not the sender still waits for the answer: a server that
// received the request and runs it late.
type slowApply struct {
	*memstore.Store
	delay time.Duration
	wg    sync.WaitGroup
}

func (s *slowApply) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	type result struct {
		g   driver.Grant
		err error
	}
	done := make(chan result, 1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		time.Sleep(s.delay)
		g, err := s.Store.Acquire(context.Background(), req)
		done <- result{g, err}
	}()
	select {
	case r := <-done:
		return r.g, r.err
	case <-ctx.Done():
		return driver.Grant{}, ctx.Err()
	}
}

// An acquire whose caller gives up while the request is in flight, and that
// the server applies shortly after: the Locker waits for that answer and
// releases the grant after it. Its clean-up release sent at once would have
// run before the grant, which then stayed until its TTL.
func TestAcquireAppliedAfterTheCallerGaveUpIsReleased(t *testing.T) {
	store := &slowApply{Store: memstore.New(), delay: 50 * time.Millisecond}
	l, _, _ := newLocker(t, store, leasehold.Options{TTL: time.Minute})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	lease, err := l.TryAcquire(ctx, "k")
	if lease != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("expected no lease and context.DeadlineExceeded, got lease=%v, %v", lease != nil, err)
	}
	store.wg.Wait() // the server applied the acquire
	deadline := time.Now().Add(5 * time.Second)
	for held(t, store.Store) {
		if time.Now().After(deadline) {
			t.Fatal("the grant applied after the caller gave up is still held 5 s later (TTL 1 min)")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Observe's channel is closed by the time Close returns, also while the
// observer waits on a store call that does not answer (its context ends
// with the Locker), and at once for an Observe after Close: no goroutine
// of it outlives the Locker.
func TestObserveEndsBeforeCloseReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		l, err := leasehold.New(store, leasehold.Options{})
		if err != nil {
			t.Fatal(err)
		}
		e, err := leasehold.NewElection(l, "lead", leasehold.Callbacks{})
		if err != nil {
			t.Fatal(err)
		}
		ch := e.Observe(context.Background())
		<-ch // vacant
		store.SetFaults(func(op memstore.Op, _ string) memstore.Fault {
			if op == memstore.OpInspect {
				return memstore.Fault{Delay: time.Hour} // a stalled store
			}
			return memstore.Fault{}
		})
		time.Sleep(2 * time.Second) // the observer's next look is stalled
		_ = l.Close()
		for name, c := range map[string]<-chan leasehold.Leader{"before Close": ch, "after Close": e.Observe(context.Background())} {
			select {
			case _, ok := <-c:
				if ok {
					t.Fatalf("%s: expected no leader change", name)
				}
			default:
				t.Fatalf("%s: expected Observe's channel closed when Close returned", name)
			}
		}
	})
}

// A caller whose context already ended gets no lease and sends nothing:
// no acquire request, and so no clean-up release either.
func TestAcquireWithAnEndedContextSendsNothing(t *testing.T) {
	store := memstore.New()
	ops := countOps(store, nil)
	l, _, _ := newLocker(t, store, leasehold.Options{TTL: 5 * time.Second})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for name, call := range map[string]func() (*leasehold.Lease, error){
		"TryAcquire": func() (*leasehold.Lease, error) { return l.TryAcquire(ctx, "ended") },
		"Acquire":    func() (*leasehold.Lease, error) { return l.Acquire(ctx, "ended") },
	} {
		if ls, err := call(); ls != nil || !errors.Is(err, context.Canceled) || !errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("%s: expected no lease and context.Canceled (matching ErrNotAcquired), got %v, %v", name, ls, err)
		}
	}
	if n, r := ops.get(memstore.OpAcquire), ops.get(memstore.OpRelease); n != 0 || r != 0 {
		t.Fatalf("expected no store request for callers whose context had ended, got %d acquires and %d releases", n, r)
	}
}
