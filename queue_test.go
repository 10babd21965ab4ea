package leasehold_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/memstore"
)

// recordingStore records what the Locker sends to a memstore, with the
// (fake) time of every call. Every optional capability of memstore is
// forwarded by embedding.
type recordingStore struct {
	*memstore.Store
	mu       sync.Mutex
	acquires []acquireCall
	releases []string // tokens
	subs     []subCall
	refresh  []refreshCall
	release  func(key, token string) error // overrides Release when set
}

type refreshCall struct {
	reqs []driver.QueueRefresh
	at   time.Time
	errs []error
}

type acquireCall struct {
	req driver.AcquireRequest
	at  time.Time
	err error
}

type subCall struct {
	key, token string
	ctx        context.Context
}

func newRecordingStore(opts ...memstore.Option) *recordingStore {
	return &recordingStore{Store: memstore.New(opts...)}
}

func (s *recordingStore) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	at := time.Now()
	g, err := s.Store.Acquire(ctx, req)
	s.mu.Lock()
	s.acquires = append(s.acquires, acquireCall{req: req, at: at, err: err})
	s.mu.Unlock()
	return g, err
}

func (s *recordingStore) RefreshQueue(ctx context.Context, reqs []driver.QueueRefresh) []error {
	at := time.Now()
	errs := s.Store.RefreshQueue(ctx, reqs)
	s.mu.Lock()
	s.refresh = append(s.refresh, refreshCall{reqs: reqs, at: at, errs: errs})
	s.mu.Unlock()
	return errs
}

func (s *recordingStore) refreshes() []refreshCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]refreshCall(nil), s.refresh...)
}

func (s *recordingStore) Release(ctx context.Context, key, token string) error {
	s.mu.Lock()
	s.releases = append(s.releases, token)
	f := s.release
	s.mu.Unlock()
	if f != nil {
		return f(key, token)
	}
	return s.Store.Release(ctx, key, token)
}

func (s *recordingStore) WaitRelease(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	s.mu.Lock()
	s.subs = append(s.subs, subCall{key, token, ctx})
	s.mu.Unlock()
	return s.Store.WaitRelease(ctx, key, token)
}

func (s *recordingStore) calls() []acquireCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]acquireCall(nil), s.acquires...)
}

func (s *recordingStore) released() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.releases...)
}

// heldAndWaiter returns key "k" held over store (TTL 10 s, released when
// the test ends) and a second Locker to wait for it (WaiterTTL 3 s).
func heldAndWaiter(t *testing.T, store driver.Store) (*leasehold.Lease, *leasehold.Locker) {
	t.Helper()
	holder, _, _ := newLocker(t, store, leasehold.Options{Name: "holder", TTL: 10 * time.Second})
	waiter, _, _ := newLocker(t, store, leasehold.Options{Name: "waiter", WaiterTTL: 3 * time.Second, WaitCap: time.Minute})
	held, err := holder.TryAcquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = held.Release(context.Background()) })
	return held, waiter
}

func TestWaitingAcquireQueuesAndTryAcquireNever(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newRecordingStore()
		held, waiter := heldAndWaiter(t, store)
		if _, err := waiter.TryAcquire(t.Context(), "k"); !errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("expected ErrNotAcquired, got %v", err)
		}
		if _, err := waiter.Hold(t.Context(), "k", time.Second); !errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("expected ErrNotAcquired, got %v", err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 4500*time.Millisecond)
		defer cancel()
		start, tries := time.Now(), len(store.calls())
		if _, err := waiter.Acquire(ctx, "k"); !errors.Is(err, leasehold.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("expected ErrNotAcquired and DeadlineExceeded, got %v", err)
		}
		var waits []time.Duration
		for i, c := range store.calls() {
			switch {
			case c.req.Holder == "":
				t.Fatalf("expected every request to carry the holder identity, got %+v", c.req)
			case c.req.Token == held.Token():
			case i < tries:
				if c.req.QueueTTL != 0 {
					t.Fatalf("expected TryAcquire and Hold never to queue, got QueueTTL %v", c.req.QueueTTL)
				}
			default:
				if c.req.QueueTTL != 3*time.Second {
					t.Fatalf("expected a waiting acquire to send QueueTTL = WaiterTTL (3s), got %v", c.req.QueueTTL)
				}
				waits = append(waits, c.at.Sub(start))
			}
		}
		// Subscribe and retry at once; then the Locker's keeper refreshes
		// the place every WaiterTTL/3 without an Acquire.
		if want := []time.Duration{0, 0}; fmt.Sprint(waits) != fmt.Sprint(want) {
			t.Fatalf("expected acquire requests at %v, got %v", want, waits)
		}
		var refreshes []time.Duration
		for _, c := range store.refreshes() {
			if len(c.reqs) != 1 || c.reqs[0].QueueTTL != 3*time.Second || c.errs[0] != nil {
				t.Fatalf("expected a refresh of the one place for WaiterTTL (3s), kept, got %+v", c)
			}
			refreshes = append(refreshes, c.at.Sub(start))
		}
		if want := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second}; fmt.Sprint(refreshes) != fmt.Sprint(want) {
			t.Fatalf("expected refreshes at %v, got %v", want, refreshes)
		}
	})
}

// TestKeptPlaceLostIsQueuedAgain: when a refresh finds the waiter's place
// gone (ErrNotQueued), the waiter queues again with a full Acquire at once,
// and the keeper goes on refreshing the new place.
func TestKeptPlaceLostIsQueuedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newRecordingStore()
		held, waiter := heldAndWaiter(t, store)
		ctx, cancel := context.WithTimeout(t.Context(), 4500*time.Millisecond)
		defer cancel()
		start := time.Now()
		go func() {
			time.Sleep(1500 * time.Millisecond)
			calls := store.calls()
			_ = store.Store.Release(t.Context(), "k", calls[len(calls)-1].req.Token) // the place is lost
		}()
		if _, err := waiter.Acquire(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("expected DeadlineExceeded, got %v", err)
		}
		var acquires []time.Duration
		for _, c := range store.calls() {
			if c.req.Token != held.Token() {
				acquires = append(acquires, c.at.Sub(start))
			}
		}
		if want := []time.Duration{0, 0, 2 * time.Second}; fmt.Sprint(acquires) != fmt.Sprint(want) {
			t.Fatalf("expected acquire requests at %v (queued again after the refresh at 2s), got %v", want, acquires)
		}
		var refreshes []string
		for _, c := range store.refreshes() {
			refreshes = append(refreshes, fmt.Sprintf("%v:%v", c.at.Sub(start), c.errs[0] == nil))
		}
		if want := []string{"1s:true", "2s:false", "3s:true", "4s:true"}; fmt.Sprint(refreshes) != fmt.Sprint(want) {
			t.Fatalf("expected refreshes (at:kept) %v, got %v", want, refreshes)
		}
	})
}

func TestWaiterWakesAtTheHoldersExactExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		crashed, _, _ := newLocker(t, store, leasehold.Options{Name: "crashed"})
		waiter, _, _ := newLocker(t, store, leasehold.Options{Name: "waiter"})
		const ttl = 700 * time.Millisecond
		// A hold is never renewed nor released: like a holder that died.
		if _, err := crashed.Hold(t.Context(), "k", ttl); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		start := time.Now()
		ls, err := waiter.Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		defer ls.Release(t.Context())
		if d := time.Since(start); d != ttl-100*time.Millisecond {
			t.Fatalf("expected the takeover exactly at the holder's expiry (%v), got %v", ttl-100*time.Millisecond, d)
		}
	})
}

func TestWaiterThatGivesUpLeavesTheQueue(t *testing.T) {
	for _, how := range []string{"deadline", "Close"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := newRecordingStore()
				holder, _, _ := newLocker(t, store, leasehold.Options{Name: "holder"})
				waiter, err := leasehold.New(store, leasehold.Options{Name: "waiter"})
				if err != nil {
					t.Fatal(err)
				}
				defer waiter.Close()
				held, err := holder.TryAcquire(t.Context(), "k")
				if err != nil {
					t.Fatal(err)
				}
				defer held.Release(t.Context())
				ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
				defer cancel()
				done := make(chan error, 1)
				go func() {
					_, err := waiter.Acquire(ctx, "k")
					done <- err
				}()
				time.Sleep(time.Second)
				if how == "Close" {
					_ = waiter.Close() // returns after the waiter left the queue
				} else {
					err = <-done
					_ = waiter.Close() // joins the clean-up
				}
				calls := store.calls()
				token := calls[len(calls)-1].req.Token
				var left bool
				for _, tok := range store.released() {
					left = left || tok == token
				}
				if how == "Close" {
					err = <-done
				}
				if !left {
					t.Fatalf("expected the waiter (%v) to leave the queue with a release of its token", err)
				}
			})
		})
	}
}

func TestWaiterSubscribesWithItsOwnContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newRecordingStore()
		holder, _, _ := newLocker(t, store, leasehold.Options{Name: "holder"})
		waiter, _, _ := newLocker(t, store, leasehold.Options{Name: "waiter"})
		held, err := holder.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release(t.Context())
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, _ = waiter.Acquire(ctx, "k")
		store.mu.Lock()
		defer store.mu.Unlock()
		if len(store.subs) != 1 {
			t.Fatalf("expected one subscription, got %d", len(store.subs))
		}
		if _, ok := store.subs[0].ctx.Deadline(); !ok || store.subs[0].ctx.Err() == nil {
			t.Fatalf("expected the subscription bounded by the waiter's context (deadline %v, err %v)", ok, store.subs[0].ctx.Err())
		}
	})
}

func TestLocalGateIsFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		l, _, _ := newLocker(t, store, leasehold.Options{})
		first, err := l.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		const n = 20
		order := make(chan int, n)
		for i := range n {
			go func() {
				ls, err := l.Acquire(t.Context(), "k")
				if err != nil {
					t.Error(err)
					return
				}
				order <- i
				_ = ls.Release(t.Context())
			}()
			synctest.Wait() // goroutine i queues before goroutine i+1
		}
		_ = first.Release(t.Context())
		for want := range n {
			if got := <-order; got != want {
				t.Fatalf("expected goroutine %d next, got %d", want, got)
			}
		}
	})
}

// With the store's queue, separate Lockers (separate replicas) get the key
// in the order they started waiting, and each hand-off is woken at once.
func TestWaitersAcrossLockersAreServedInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		holder, _, _ := newLocker(t, store, leasehold.Options{Name: "holder"})
		held, err := holder.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		const n = 5
		order := make(chan int, n)
		var wg sync.WaitGroup
		defer wg.Wait()
		for i := range n {
			l, _, _ := newLocker(t, store, leasehold.Options{Name: "replica-" + itoa(i), WaitCap: time.Minute})
			wg.Add(1)
			go func() {
				defer wg.Done()
				ls, err := l.Acquire(t.Context(), "k")
				if err != nil {
					t.Error(err)
					return
				}
				order <- i
				time.Sleep(10 * time.Millisecond)
				_ = ls.Release(t.Context())
			}()
			synctest.Wait() // replica i is queued before replica i+1 starts
		}
		start := time.Now()
		_ = held.Release(t.Context())
		for want := range n {
			if got := <-order; got != want {
				t.Fatalf("expected replica %d next, got %d", want, got)
			}
		}
		if d := time.Since(start); d != (n-1)*10*time.Millisecond {
			t.Fatalf("expected every hand-off at once (%v in all), got %v", (n-1)*10*time.Millisecond, d)
		}
	})
}
