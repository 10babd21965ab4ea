package leasehold_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
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
}

func TestBatchRenewalOutcomesPerLease(t *testing.T) {
	store := memstore.New()
	ops := countOps(store, nil)
	const n, interval = 10, 40 * time.Millisecond
	l, rec, _ := newLocker(t, store, leasehold.Options{TTL: 10 * interval, RenewInterval: interval, MaxRenewFailures: 3})
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

	// The store fails every renewal: every lease is abandoned after exactly
	// its own budget, batched or not.
	before := len(rec.find(leasehold.EventRenewFailed))
	ops.setFail(func(op memstore.Op, _ string) memstore.Fault {
		if op == memstore.OpRenew || op == memstore.OpRenewBatch {
			return memstore.Fault{Err: memstore.ErrUnavailable}
		}
		return memstore.Fault{}
	})
	for i, ls := range leases {
		if i == 3 {
			continue
		}
		waitDone(t, ls.Context(), 3*time.Second, "lease "+strconv.Itoa(i))
		if cause := context.Cause(ls.Context()); !errors.Is(cause, leasehold.ErrLeaseAbandoned) {
			t.Fatalf("lease %d: expected ErrLeaseAbandoned, got %v", i, cause)
		}
	}
	if got, want := len(rec.find(leasehold.EventRenewFailed))-before, 3*(n-1); got != want {
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
}
