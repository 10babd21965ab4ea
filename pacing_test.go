package leasehold_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/memstore"
)

// oneThreadStore serves renewal batches one at a time, each taking per ×
// its size: a store with one thread (Redis) behind one connection, whose
// calls queue instead of running side by side. It records how many calls
// were in flight at most.
type oneThreadStore struct {
	*memstore.Store
	per    time.Duration
	server chan struct{} // capacity 1: the one thread

	mu       sync.Mutex
	inFlight int
	maxIn    int
	calls    int
}

func newOneThreadStore(per time.Duration) *oneThreadStore {
	return &oneThreadStore{Store: memstore.New(), per: per, server: make(chan struct{}, 1)}
}

func (s *oneThreadStore) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []error {
	s.mu.Lock()
	s.inFlight++
	s.calls++
	s.maxIn = max(s.maxIn, s.inFlight)
	s.mu.Unlock()
	defer func() { s.mu.Lock(); s.inFlight--; s.mu.Unlock() }()
	fail := func(err error) []error {
		errs := make([]error, len(reqs))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	select {
	case s.server <- struct{}{}:
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	defer func() { <-s.server }()
	select {
	case <-time.After(time.Duration(len(reqs)) * s.per):
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	return s.Store.RenewBatch(ctx, reqs)
}

func (s *oneThreadStore) stats() (maxIn, calls int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxIn, s.calls
}

// With TTL 2 s (RenewTimeout 302 ms), 1,000 leases taken at once fall due
// at once: four batches of 256 that take 128 ms each on a one-thread store.
// Sent together, the last waits 384 ms and times out, round after round;
// paced, every renewal succeeds and no lease ends, at 75 % of the store's
// capacity.
func TestPacedRenewalsHoldWhatTheStoreCanServe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newOneThreadStore(500 * time.Microsecond) // 2,000 renewals/s
		l, rec, logs := newLocker(t, store, leasehold.Options{TTL: 2 * time.Second})
		leases := acquireMany(t, l, 1000) // 1,500 renewals/s due
		time.Sleep(20 * time.Second)
		for _, ls := range leases {
			if err := ls.Err(); err != nil {
				t.Fatalf("expected every lease held, %s ended: %v", ls.Key(), err)
			}
		}
		if n := rec.count(leasehold.EventRenewFailed); n != 0 {
			t.Fatalf("expected no failed renewal, got %d", n)
		}
		if n := rec.count(leasehold.EventRenewalBehind); n != 0 {
			t.Fatalf("expected no renewal_behind at 75%% of capacity, got %d: %s", n, logs)
		}
		if n := rec.count(leasehold.EventRenewed); n < 1000*20*2/3*9/10 {
			t.Fatalf("expected about 20,000 renewals in 20 s, got %d", n)
		}
	})
}

// Past the store's capacity the renewal calls in flight stay bounded, none
// times out, and the Locker says it falls behind (event and warning) before
// the first lease ends.
func TestRenewalsFallingBehindAreReportedBeforeALeaseEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newOneThreadStore(500 * time.Microsecond) // 2,000 renewals/s
		l, rec, logs := newLocker(t, store, leasehold.Options{Name: "busy", TTL: 2 * time.Second})
		leases := acquireMany(t, l, 3000) // 4,500 renewals/s due
		ended := make(chan struct{})
		var once sync.Once
		for _, ls := range leases {
			context.AfterFunc(ls.Context(), func() { once.Do(func() { close(ended) }) })
		}
		<-ended
		behind := rec.find(leasehold.EventRenewalBehind)
		if len(behind) == 0 {
			t.Fatalf("expected renewal_behind before the first lease ended, got none; logs: %s", logs)
		}
		if e := behind[0]; e.Locker != "busy" || e.Key != "" || e.Duration <= 0 || e.Attempt <= 0 {
			t.Fatalf("expected renewal_behind of locker busy with lag and waiting renewals, got %+v", e)
		}
		if !strings.Contains(logs.String(), "renewals fall behind") {
			t.Fatalf("expected a warning, got %s", logs)
		}
		if maxIn, calls := store.stats(); maxIn > 8 || calls == 0 {
			t.Fatalf("expected at most 8 renewal calls in flight, got %d (of %d calls)", maxIn, calls)
		}
		if n := rec.count(leasehold.EventRenewFailed); n != 0 {
			t.Fatalf("expected no renewal to time out, got %d failures", n)
		}
		for _, ls := range leases {
			if err := ls.Err(); err != nil && !errors.Is(err, leasehold.ErrLeaseExpired) {
				t.Fatalf("expected leases to end only by their guard, got %v", err)
			}
		}
	})
}

// Past the store's capacity the leases it can serve stay held: renewals are
// sent late rather than all timing out, so about what the store renews per
// stretched interval survives (2,304 of 3,000 here; the unpaced scheduler
// kept 1,208 after 13,312 failed renewals).
func TestPastCapacityTheLeasesTheStoreServesStayHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newOneThreadStore(500 * time.Microsecond) // 2,000 renewals/s
		l, rec, _ := newLocker(t, store, leasehold.Options{TTL: 2 * time.Second})
		leases := acquireMany(t, l, 3000) // 4,500 renewals/s due
		time.Sleep(20 * time.Second)
		alive := 0
		for _, ls := range leases {
			if ls.Err() == nil {
				alive++
			}
		}
		if alive < 2000 {
			t.Fatalf("expected at least 2,000 of 3,000 leases held at 2,000 renewals/s, got %d", alive)
		}
		if n := rec.count(leasehold.EventRenewFailed); n != 0 {
			t.Fatalf("expected no renewal to time out, got %d failures", n)
		}
	})
}
