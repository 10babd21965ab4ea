package leasehold_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
)

// acquireMany takes n leases on distinct keys as close together as it can.
func acquireMany(t *testing.T, l *leasehold.Locker, n int) []*leasehold.Lease {
	t.Helper()
	leases := make([]*leasehold.Lease, n)
	for i := range leases {
		ls, err := l.TryAcquire(t.Context(), "batch:"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = ls
	}
	return leases
}

func TestManyLeasesRenewInFewRoundTrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		ops := countOps(store, nil)
		const n, interval = 40, 60 * time.Millisecond
		l, rec, _ := newLocker(t, store, leasehold.Options{TTL: 3 * interval, RenewInterval: interval})
		leases := acquireMany(t, l, n)
		time.Sleep(10*interval + interval/2) // ~10 renewals per lease, well past the TTL
		for i, ls := range leases {
			if err := ls.Err(); err != nil {
				t.Fatalf("lease %d: expected it kept alive by batched renewals, got %v", i, err)
			}
		}
		single, batches := ops.get(memstore.OpRenew), ops.get(memstore.OpRenewBatch)
		renewed := rec.count(leasehold.EventRenewed)
		t.Logf("%d renewals in %d batches and %d single renewals", renewed, batches, single)
		if renewed < n*8 {
			t.Fatalf("expected about 10 renewals per lease, got %d for %d leases", renewed, n)
		}
		if trips := single + batches; trips*4 > renewed {
			t.Fatalf("expected batching to need under a quarter of the round trips, got %d round trips for %d renewals", trips, renewed)
		}
		for _, ls := range leases {
			if err := ls.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestBatchRenewalLossIsPerLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		ops := countOps(store, nil)
		const n, interval = 10, 40 * time.Millisecond
		l, _, _ := newLocker(t, store, leasehold.Options{TTL: 10 * interval, RenewInterval: interval, MaxRenewFailures: 3})
		leases := acquireMany(t, l, n)

		// One lock taken away: only its lease is lost; the others keep renewing.
		if _, err := store.ForceRelease(t.Context(), leases[3].Key()); err != nil {
			t.Fatal(err)
		}
		waitDone(t, leases[3].Context(), 2*time.Second, "lease 3")
		if cause := context.Cause(leases[3].Context()); !errors.Is(cause, leasehold.ErrLeaseLost) {
			t.Fatalf("expected lease 3 lost, got %v", cause)
		}
		time.Sleep(3 * interval)
		for i, ls := range leases {
			if i != 3 && ls.Err() != nil {
				t.Fatalf("lease %d: expected it unaffected by lease 3's loss, got %v", i, ls.Err())
			}
		}
		if ops.get(memstore.OpRenewBatch) == 0 {
			t.Fatal("expected batched renewals")
		}
	})
}

// The store fails every renewal: every lease is abandoned after exactly its
// own budget, batched or not.
func TestBatchRenewalFailuresArePerLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		ops := countOps(store, nil)
		const n, interval = 9, 40 * time.Millisecond
		l, rec, _ := newLocker(t, store, leasehold.Options{TTL: 10 * interval, RenewInterval: interval, MaxRenewFailures: 3})
		leases := acquireMany(t, l, n)
		time.Sleep(interval + interval/2) // a batch went well
		before := len(rec.find(leasehold.EventRenewFailed))
		failRenewals(ops, 0)
		for i, ls := range leases {
			waitDone(t, ls.Context(), 3*time.Second, "lease "+strconv.Itoa(i))
			if cause := context.Cause(ls.Context()); !errors.Is(cause, leasehold.ErrLeaseAbandoned) {
				t.Fatalf("lease %d: expected ErrLeaseAbandoned, got %v", i, cause)
			}
		}
		if got, want := len(rec.find(leasehold.EventRenewFailed))-before, 3*n; got != want {
			t.Fatalf("expected exactly %d renewal failures (3 per lease), got %d", want, got)
		}
		for _, e := range rec.find(leasehold.EventAbandoned) {
			if e.Attempt != 3 {
				t.Fatalf("expected abandonment after 3 attempts, got %d for %s", e.Attempt, e.Key)
			}
		}
		if n := rec.count(leasehold.EventAbandoned); n != 9 {
			t.Fatalf("expected 9 abandoned leases, got %d", n)
		}
	})
}

// slowBatches delays every batch renewal by d.
func slowBatches(store *memstore.Store, d time.Duration) {
	store.SetFaults(func(op memstore.Op, _ string) memstore.Fault {
		if op == memstore.OpRenewBatch {
			return memstore.Fault{Delay: d}
		}
		return memstore.Fault{}
	})
}

func TestReleaseDuringABatchDoesNotHurtPeers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, victim := range []int{0, 1} { // the batch leader or its peer
			store := memstore.New()
			l, rec, _ := newLocker(t, store, leasehold.Options{TTL: 2 * time.Second, RenewInterval: 100 * time.Millisecond, MaxRenewFailures: 1})
			leases := acquireMany(t, l, 2)
			slowBatches(store, 300*time.Millisecond)
			time.Sleep(150 * time.Millisecond) // the first batch is in flight
			if err := leases[victim].Release(t.Context()); err != nil {
				t.Fatalf("release: %v", err)
			}
			store.SetFaults(nil)
			time.Sleep(400 * time.Millisecond)
			survivor := leases[1-victim]
			if err := survivor.Err(); err != nil {
				t.Fatalf("victim %d: expected the other lease unharmed, got %v", victim, err)
			}
			if n := rec.count(leasehold.EventRenewFailed); n != 0 {
				t.Fatalf("victim %d: expected no renewal failure counted for a cancelled batch, got %d", victim, n)
			}
			_ = survivor.Release(t.Context())
		}
	})
}

func TestCloseDuringABatchEndsLeasesAsClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New()
		l, rec, _ := newLocker(t, store, leasehold.Options{TTL: 2 * time.Second, RenewInterval: 100 * time.Millisecond, MaxRenewFailures: 1})
		leases := acquireMany(t, l, 3)
		slowBatches(store, time.Second)
		time.Sleep(150 * time.Millisecond)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		store.SetFaults(nil)
		for i, ls := range leases {
			if cause := context.Cause(ls.Context()); !errors.Is(cause, leasehold.ErrLockerClosed) {
				t.Fatalf("lease %d: expected ErrLockerClosed, got %v", i, cause)
			}
		}
		if n := rec.count(leasehold.EventAbandoned) + rec.count(leasehold.EventRenewFailed); n != 0 {
			t.Fatalf("expected no failure counted for renewals Close cancelled, got %d", n)
		}
		if infos, _ := store.List(t.Context(), ""); len(infos) != 0 {
			t.Fatalf("expected Close to release every lock, %d left", len(infos))
		}
	})
}
