package prommetrics_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
)

// TestPermitGauges: permits held and permits waiting move with a
// Semaphore's permits and waiting acquisitions; a lock counts in
// leases_held only.
func TestPermitGauges(t *testing.T) {
	e := newEnv(t)
	l := e.locker("tenants", leasehold.Options{})
	gauge := func(name string) float64 {
		t.Helper()
		m := find(t, e.reg, name, "locker", "tenants")
		if m == nil || m.GetGauge() == nil {
			t.Fatalf("no gauge %s{locker=tenants}", name)
		}
		return m.GetGauge().GetValue()
	}
	want := func(step string, held, leases, waiting float64) {
		t.Helper()
		if h, ls, w := gauge(permitsHeld), gauge(leasesHeld), gauge(permitsWait); h != held || ls != leases || w != waiting {
			t.Fatalf("%s: expected permits_held %v, leases_held %v, permits_waiting %v; got %v, %v, %v", step, held, leases, waiting, h, ls, w)
		}
	}
	sem, err := l.Semaphore("tenant/a", 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxTimeout(t, 20*time.Second)
	p, err := sem.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lock, err := l.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	want("a permit and a lock", 1, 2, 0)

	type result struct {
		l   *leasehold.Lease
		err error
	}
	first := make(chan result, 1)
	go func() {
		q, err := sem.Acquire(ctx)
		first <- result{q, err}
	}()
	e.waitEvents(leasehold.EventPermitWaiting, 1)
	want("one waiter", 1, 2, 1)
	gctx, giveUp := context.WithCancel(ctx)
	second := make(chan error, 1)
	go func() {
		_, err := sem.Acquire(gctx)
		second <- err
	}()
	e.waitEvents(leasehold.EventPermitWaiting, 2)
	want("two waiters", 1, 2, 2)
	giveUp()
	if err := <-second; !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("waiter that gave up: expected ErrNotAcquired, got %v", err)
	}
	e.waitEvents(leasehold.EventPermitWaitEnded, 1)
	want("one waiter gave up", 1, 2, 1)

	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-first
	if r.err != nil {
		t.Fatalf("first waiter: %v", r.err)
	}
	e.waitEvents(leasehold.EventPermitWaitEnded, 2)
	want("the permit passed to the first waiter", 1, 2, 0)
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lock.Release(ctx); err != nil {
		t.Fatal(err)
	}
	want("everything released", 0, 0, 0)
}
