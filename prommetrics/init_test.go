package prommetrics_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/leasehold/leasehold"
)

// Init makes every series of a locker, and the stale-write counter of each
// resource, exist at zero before the first event: a counter whose first
// sample is already 1 is invisible to increase() (issue 16: the stale-write
// alert never fired in a drill).
func TestInitCreatesSeriesAtZero(t *testing.T) {
	e := newEnv(t)
	e.obs.Init("approval", "orders", "invoices")
	if n, err := testutil.GatherAndCount(e.reg); err != nil || n != seriesPerLocker+2 {
		t.Fatalf("expected %d series after Init, got %d (%v)", seriesPerLocker+2, n, err)
	}
	e.wantCounter(0, staleWrites, "locker", "approval", "resource", "orders")
	e.wantCounter(0, staleWrites, "locker", "approval", "resource", "invoices")
	e.wantCounter(0, storeErrors, "locker", "approval", "op", "acquire")
	e.wantCounter(0, lost, "locker", "approval")
	e.wantCount(0, acquireWait, "locker", "approval", "result", "acquired")

	// The first event moves the series Init created: no new series.
	e.obs.Observe(leasehold.Event{Kind: leasehold.EventStaleWrite, Locker: "approval", Op: "orders", Fence: 3})
	e.obs.Observe(leasehold.Event{Kind: leasehold.EventStoreError, Locker: "approval", Op: "renew"})
	e.wantCounter(1, staleWrites, "locker", "approval", "resource", "orders")
	e.wantCounter(1, storeErrors, "locker", "approval", "op", "renew")
	if n, _ := testutil.GatherAndCount(e.reg); n != seriesPerLocker+2 {
		t.Fatalf("expected the first events to add no series, got %d", n)
	}
	// Init again is harmless.
	e.obs.Init("approval", "orders")
	e.wantCounter(1, staleWrites, "locker", "approval", "resource", "orders")
}

func TestLeasesHeldGauge(t *testing.T) {
	e := newEnv(t)
	l := e.locker("approval", leasehold.Options{})
	gauge := func() float64 {
		t.Helper()
		m := find(t, e.reg, leasesHeld, "locker", "approval")
		if m == nil || m.GetGauge() == nil {
			t.Fatalf("no gauge %s{locker=approval}", leasesHeld)
		}
		return m.GetGauge().GetValue()
	}
	a, err := l.TryAcquire(t.Context(), "job/1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.TryAcquire(t.Context(), "job/2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(t.Context(), "job/1"); err == nil {
		t.Fatal("expected contention on job/1")
	}
	if g := gauge(); g != 2 {
		t.Fatalf("expected 2 leases held, got %v", g)
	}
	if err := a.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if g := gauge(); g != 1 {
		t.Fatalf("expected 1 lease held after a release, got %v", g)
	}
	// A lease that ends without a release (the store forgot it) leaves too.
	e.store.Restart()
	_ = b.Renew(t.Context()) // answered "not owned": the lease is lost
	_ = waitDone(t, b)
	e.waitEvents(leasehold.EventHeld, 2)
	if g := gauge(); g != 0 {
		t.Fatalf("expected 0 leases held after a lost lease, got %v", g)
	}

	// A fail-open lease counts while it lasts.
	c := e.locker("cleanup", leasehold.Options{OnStoreError: leasehold.FailOpen})
	e.store.SetDown(true)
	d, err := c.TryAcquire(ctxTimeout(t, 5*time.Second), "sweep")
	if err != nil {
		t.Fatal(err)
	}
	if m := find(t, e.reg, leasesHeld, "locker", "cleanup"); m.GetGauge().GetValue() != 1 {
		t.Fatalf("expected 1 degraded lease held, got %v", m.GetGauge().GetValue())
	}
	_ = d.Release(t.Context())
	e.store.SetDown(false)
	if m := find(t, e.reg, leasesHeld, "locker", "cleanup"); m.GetGauge().GetValue() != 0 {
		t.Fatalf("expected 0 after releasing the degraded lease, got %v", m.GetGauge().GetValue())
	}
}
