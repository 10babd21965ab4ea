package prommetrics_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
	"github.com/leasehold/leasehold/prommetrics"
)

const (
	acquireWait   = "leasehold_acquire_wait_seconds"
	heldSeconds   = "leasehold_held_seconds"
	renewSeconds  = "leasehold_renew_seconds"
	contention    = "leasehold_contention_total"
	failOpen      = "leasehold_fail_open_total"
	renewFailures = "leasehold_renewal_failures_total"
	abandoned     = "leasehold_abandoned_total"
	lost          = "leasehold_lost_total"
	expired       = "leasehold_expired_total"
	maxHold       = "leasehold_max_hold_total"
	behind        = "leasehold_renewals_behind_total"
	notOwned      = "leasehold_not_owned_total"
	storeErrors   = "leasehold_store_errors_total"
	staleWrites   = "leasehold_stale_writes_rejected_total"
	leasesHeld    = "leasehold_leases_held"
	permitsHeld   = "leasehold_permits_held"
	permitsWait   = "leasehold_permits_waiting"
)

// seriesPerLocker is the number of series one locker name creates: 3 acquire
// results + 7 held reasons + renew + 8 plain counters + 3 not-owned ops + 6
// store ops + the leases-held gauge + misconfigured + the permits-held and
// permits-waiting gauges + 3 config-warning checks.
const seriesPerLocker = 3 + 7 + 1 + 8 + 3 + 6 + 1 + 1 + 2 + 3

var errRenewDown = errors.New("injected renew failure")

func failRenew(op memstore.Op, _ string) memstore.Fault {
	if op == memstore.OpRenew {
		return memstore.Fault{Err: errRenewDown}
	}
	return memstore.Fault{}
}

func TestAcquireResults(t *testing.T) {
	e := newEnv(t)
	a := e.locker("approval", leasehold.Options{})
	b := e.locker("workflow", leasehold.Options{})

	lease, err := a.TryAcquire(t.Context(), "job/1")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	e.wantCount(1, acquireWait, "locker", "approval", "result", "acquired")
	e.wantCount(0, acquireWait, "locker", "approval", "result", "contended")

	// Another replica (locker) finds the key taken in the store.
	if _, err := b.TryAcquire(t.Context(), "job/1"); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	// A goroutine of the holder's process finds it taken in the local gate.
	if _, err := a.TryAcquire(t.Context(), "job/1"); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	e.wantCount(1, acquireWait, "locker", "workflow", "result", "contended")
	e.wantCount(1, acquireWait, "locker", "approval", "result", "contended")
	e.wantCounter(1, contention, "locker", "workflow")
	e.wantCounter(1, contention, "locker", "approval")

	// A blocking Acquire that gives up is contended too, and its wait is
	// recorded.
	if _, err := b.Acquire(ctxTimeout(t, 80*time.Millisecond), "job/1"); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	n, sum := e.hist(acquireWait, "locker", "workflow", "result", "contended")
	if n != 2 || sum < 0.08 {
		t.Errorf("expected 2 contended samples summing to >= 0.08 s, got %d summing to %v", n, sum)
	}
	if got := e.counter(contention, "locker", "workflow"); got < 2 {
		t.Errorf("expected >= 2 contention for workflow, got %v", got)
	}

	// Store down, fail-closed: result error and a store error on acquire.
	e.store.SetDown(true)
	if _, err := b.TryAcquire(t.Context(), "job/2"); !errors.Is(err, leasehold.ErrStore) {
		t.Fatalf("expected ErrStore, got %v", err)
	}
	e.store.SetDown(false)
	e.wantCount(1, acquireWait, "locker", "workflow", "result", "error")
	e.wantCounter(1, storeErrors, "locker", "workflow", "op", "acquire")
	e.wantCounter(0, failOpen, "locker", "workflow")

	if err := lease.Release(t.Context()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	e.wantCount(1, heldSeconds, "locker", "approval", "reason", "released")
}

func TestFailOpen(t *testing.T) {
	e := newEnv(t)
	l := e.locker("cleanup", leasehold.Options{OnStoreError: leasehold.FailOpen})
	e.store.SetDown(true)
	lease, err := l.TryAcquire(t.Context(), "sweep")
	if err != nil {
		t.Fatalf("expected a degraded lease, got %v", err)
	}
	if !lease.Degraded() {
		t.Fatalf("expected Degraded() = true")
	}
	e.wantCounter(1, failOpen, "locker", "cleanup")
	e.wantCount(1, acquireWait, "locker", "cleanup", "result", "error")
	e.wantCounter(1, storeErrors, "locker", "cleanup", "op", "acquire")
	if err := lease.Release(t.Context()); err != nil {
		t.Fatalf("Release of a degraded lease: %v", err)
	}
	e.store.SetDown(false)
	e.wantCount(1, heldSeconds, "locker", "cleanup", "reason", "released")
}

func TestRenewalFailuresThenAbandoned(t *testing.T) {
	e := newEnv(t)
	l := e.locker("approval", leasehold.Options{
		TTL: 300 * time.Millisecond, RenewInterval: 50 * time.Millisecond, MaxRenewFailures: 2,
	})
	lease, err := l.TryAcquire(t.Context(), "approve/7")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	e.store.SetFaults(failRenew)
	defer e.store.SetFaults(nil)
	if cause := waitDone(t, lease); !errors.Is(cause, leasehold.ErrLeaseAbandoned) {
		t.Fatalf("expected ErrLeaseAbandoned, got %v", cause)
	}
	e.waitEvents(leasehold.EventHeld, 1) // the context ends before the events are reported
	e.wantCounter(2, renewFailures, "locker", "approval")
	e.wantCounter(1, abandoned, "locker", "approval")
	e.wantCounter(2, storeErrors, "locker", "approval", "op", "renew")
	e.wantCounter(0, lost, "locker", "approval")
	e.wantCounter(0, expired, "locker", "approval")
	e.wantCount(1, heldSeconds, "locker", "approval", "reason", "abandoned")
	_ = lease.Release(t.Context())
}

func TestExpiredByLocalGuard(t *testing.T) {
	e := newEnv(t)
	// A failure budget far beyond the TTL: the local expiry guard fires first.
	l := e.locker("workflow", leasehold.Options{
		TTL: 300 * time.Millisecond, RenewInterval: 50 * time.Millisecond, MaxRenewFailures: 1000,
	})
	lease, err := l.TryAcquire(t.Context(), "run/1")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	e.store.SetFaults(failRenew)
	defer e.store.SetFaults(nil)
	if cause := waitDone(t, lease); !errors.Is(cause, leasehold.ErrLeaseExpired) {
		t.Fatalf("expected ErrLeaseExpired, got %v", cause)
	}
	e.waitEvents(leasehold.EventHeld, 1) // the context ends before the events are reported
	e.wantCounter(1, expired, "locker", "workflow")
	e.wantCounter(0, abandoned, "locker", "workflow")
	if got := e.counter(renewFailures, "locker", "workflow"); got < 1 {
		t.Errorf("expected >= 1 renewal failure, got %v", got)
	}
	e.wantCount(1, heldSeconds, "locker", "workflow", "reason", "expired")
	_ = lease.Release(t.Context())
}

func TestLostWhenStoreForgetsTheLock(t *testing.T) {
	e := newEnv(t)
	l := e.locker("reconciler", leasehold.Options{
		TTL: 300 * time.Millisecond, RenewInterval: 50 * time.Millisecond,
	})
	lease, err := l.TryAcquire(t.Context(), "reconcile/default")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	e.store.Restart() // the lock is gone: the next renewal is answered "not owned"
	if cause := waitDone(t, lease); !errors.Is(cause, leasehold.ErrLeaseLost) {
		t.Fatalf("expected ErrLeaseLost, got %v", cause)
	}
	e.waitEvents(leasehold.EventHeld, 1) // the context ends before the events are reported
	e.wantCounter(1, lost, "locker", "reconciler")
	e.wantCounter(1, notOwned, "locker", "reconciler", "op", "renew")
	e.wantCounter(0, notOwned, "locker", "reconciler", "op", "release")
	e.wantCount(1, heldSeconds, "locker", "reconciler", "reason", "lost")
	if err := lease.Release(t.Context()); err != nil {
		t.Fatalf("Release after loss should be a no-op, got %v", err)
	}
	e.wantCounter(0, notOwned, "locker", "reconciler", "op", "release")
}

func TestNotOwnedRelease(t *testing.T) {
	e := newEnv(t)
	l := e.locker("approval", leasehold.Options{}) // 30 s TTL: no renewal during the test
	lease, err := l.TryAcquire(t.Context(), "approve/9")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if _, err := e.store.ForceRelease(t.Context(), "approve/9"); err != nil {
		t.Fatalf("ForceRelease: %v", err)
	}
	// Another owner takes the key: only then is a release "not owned" (a
	// lock that is merely gone releases without an error).
	other := e.locker("other", leasehold.Options{})
	if _, err := other.TryAcquire(t.Context(), "approve/9"); err != nil {
		t.Fatalf("TryAcquire by another owner: %v", err)
	}
	if err := lease.Release(t.Context()); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("expected ErrNotOwned, got %v", err)
	}
	e.wantCounter(1, notOwned, "locker", "approval", "op", "release")
	e.wantCounter(0, notOwned, "locker", "approval", "op", "renew")
	e.wantCounter(0, lost, "locker", "approval")
	e.wantCount(1, heldSeconds, "locker", "approval", "reason", "released")
}

func TestMaxHold(t *testing.T) {
	e := newEnv(t)
	l := e.locker("workflow", leasehold.Options{
		TTL: 2 * time.Second, RenewInterval: 50 * time.Millisecond, MaxHold: 120 * time.Millisecond,
	})
	lease, err := l.TryAcquire(t.Context(), "run/2")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if cause := waitDone(t, lease); !errors.Is(cause, leasehold.ErrMaxHoldReached) {
		t.Fatalf("expected ErrMaxHoldReached, got %v", cause)
	}
	e.waitEvents(leasehold.EventMaxHold, 1)
	e.wantCounter(1, maxHold, "locker", "workflow")
	e.wantCounter(0, lost, "locker", "workflow")
	if err := lease.Release(t.Context()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	var total uint64
	for _, r := range prommetrics.Reasons {
		n, _ := e.hist(heldSeconds, "locker", "workflow", "reason", r)
		total += n
	}
	if total != 1 {
		t.Errorf("expected one held sample in total, got %d", total)
	}
}

func TestHeldDurationAndRenewLatency(t *testing.T) {
	e := newEnv(t)
	l := e.locker("approval", leasehold.Options{
		TTL: 600 * time.Millisecond, RenewInterval: 40 * time.Millisecond,
	})
	lease, err := l.TryAcquire(t.Context(), "approve/1")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	e.waitEvents(leasehold.EventRenewed, 2)
	if err := lease.Release(t.Context()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	n, sum := e.hist(heldSeconds, "locker", "approval", "reason", "released")
	if n != 1 || sum < 0.08 || sum > 60 {
		t.Errorf("expected one held sample of >= 80 ms (two renewals), got %d summing to %v s", n, sum)
	}
	if n, _ := e.hist(renewSeconds, "locker", "approval"); n < 2 {
		t.Errorf("expected >= 2 renew samples, got %d", n)
	}

	// A lease still held when the locker closes ends with reason "closed".
	other, err := l.TryAcquire(t.Context(), "approve/2")
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	_ = l.Close()
	if cause := other.Err(); !errors.Is(cause, leasehold.ErrLockerClosed) {
		t.Fatalf("expected ErrLockerClosed, got %v", cause)
	}
	e.wantCount(1, heldSeconds, "locker", "approval", "reason", "closed")
}

func TestStaleWriteEvents(t *testing.T) {
	e := newEnv(t)
	// Package fence reports rejections with the locker name and the resource.
	for range 3 {
		e.obs.Observe(leasehold.Event{Kind: leasehold.EventStaleWrite, Locker: "approval", Op: "orders", Key: "order/1", Fence: 41})
	}
	e.obs.Observe(leasehold.Event{Kind: leasehold.EventStaleWrite, Locker: "approval", Op: "invoices", Key: "inv/1", Fence: 7})
	e.obs.Observe(leasehold.Event{Kind: leasehold.EventStaleWrite})
	e.wantCounter(3, staleWrites, "locker", "approval", "resource", "orders")
	e.wantCounter(1, staleWrites, "locker", "approval", "resource", "invoices")
	e.wantCounter(1, staleWrites, "locker", "unknown", "resource", "unknown")
	if n, err := testutil.GatherAndCount(e.reg); err != nil || n != 3 {
		t.Fatalf("expected only the 3 stale-write series, got %d (%v)", n, err)
	}
}

// A Locker's report that its renewals fall behind is counted per locker,
// whatever its Duration and Attempt.
func TestRenewalsBehind(t *testing.T) {
	e := newEnv(t)
	e.obs.Init("bulk")
	e.obs.Observe(leasehold.Event{Kind: leasehold.EventRenewalBehind, Locker: "bulk", Op: "renew", Duration: 700 * time.Millisecond, Attempt: 4096})
	e.obs.Observe(leasehold.Event{Kind: leasehold.EventRenewalBehind, Locker: "bulk", Op: "renew"})
	e.wantCounter(2, behind, "locker", "bulk")
	e.wantCounter(0, expired, "locker", "bulk")
}

func TestUnknownEventsIgnored(t *testing.T) {
	e := newEnv(t)
	for _, k := range []leasehold.EventKind{0, -1, 999, leasehold.EventReleased} {
		e.obs.Observe(leasehold.Event{Kind: k, Locker: "approval", Key: "k", Op: "acquire", Duration: time.Second})
	}
	if n, err := testutil.GatherAndCount(e.reg); err != nil || n != 0 {
		t.Fatalf("expected no series after unknown events, got %d (%v)", n, err)
	}
	e.obs.Observe(leasehold.Event{Kind: leasehold.EventAcquire, Locker: "approval", Result: "maybe", Duration: time.Second})
	for _, r := range prommetrics.Results {
		e.wantCount(0, acquireWait, "locker", "approval", "result", r)
	}
	if m := find(t, e.reg, acquireWait, "result", "maybe"); m != nil {
		t.Errorf("expected no series for an unknown result, got %v", m)
	}
}

func TestOpLabelsAreBounded(t *testing.T) {
	e := newEnv(t)
	for _, op := range []string{"release", "renew", "acquire", "frobnicate", ""} {
		e.obs.Observe(leasehold.Event{Kind: leasehold.EventNotOwned, Locker: "approval", Op: op})
	}
	for _, op := range []string{"acquire", "renew", "release", "inspect", "list", "DROP TABLE", "job/42"} {
		e.obs.Observe(leasehold.Event{Kind: leasehold.EventStoreError, Locker: "approval", Op: op, Err: errRenewDown})
	}
	want := `
# HELP leasehold_not_owned_total Releases and renewals answered "lock not owned", by operation.
# TYPE leasehold_not_owned_total counter
leasehold_not_owned_total{locker="approval",op="other"} 3
leasehold_not_owned_total{locker="approval",op="release"} 1
leasehold_not_owned_total{locker="approval",op="renew"} 1
# HELP leasehold_store_errors_total Failures of the lock store, by operation.
# TYPE leasehold_store_errors_total counter
leasehold_store_errors_total{locker="approval",op="acquire"} 1
leasehold_store_errors_total{locker="approval",op="inspect"} 1
leasehold_store_errors_total{locker="approval",op="list"} 1
leasehold_store_errors_total{locker="approval",op="other"} 2
leasehold_store_errors_total{locker="approval",op="release"} 1
leasehold_store_errors_total{locker="approval",op="renew"} 1
`
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(want), notOwned, storeErrors); err != nil {
		t.Fatal(err)
	}
}

func TestReason(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{leasehold.ErrLeaseReleased, "released"},
		{fmt.Errorf("renew: %w", leasehold.ErrLeaseLost), "lost"},
		{leasehold.ErrLeaseAbandoned, "abandoned"},
		{leasehold.ErrLeaseExpired, "expired"},
		{leasehold.ErrMaxHoldReached, "max_hold"},
		{leasehold.ErrLockerClosed, "closed"},
		{errors.New("something else"), "other"},
		{nil, "other"},
	} {
		if got := prommetrics.Reason(c.err); got != c.want {
			t.Errorf("Reason(%v): expected %q, got %q", c.err, c.want, got)
		}
	}
}

// Ten thousand distinct keys through a real Locker must not add a single
// series: keys are never labels.
func TestCardinalityTenThousandKeys(t *testing.T) {
	e := newEnv(t)
	l := e.locker("approval", leasehold.Options{})
	cycle := func(i int) {
		key := fmt.Sprintf("job/%d", i)
		lease, err := l.TryAcquire(t.Context(), key)
		if err != nil {
			t.Fatalf("TryAcquire %s: %v", key, err)
		}
		if err := lease.Release(t.Context()); err != nil {
			t.Fatalf("Release %s: %v", key, err)
		}
	}
	cycle(0)
	first, err := testutil.GatherAndCount(e.reg)
	if err != nil {
		t.Fatal(err)
	}
	if first != seriesPerLocker {
		t.Fatalf("expected %d series for one locker, got %d", seriesPerLocker, first)
	}
	for i := 1; i < 10_000; i++ {
		cycle(i)
	}
	after, err := testutil.GatherAndCount(e.reg)
	if err != nil {
		t.Fatal(err)
	}
	if after != first {
		t.Fatalf("expected the series count to stay %d after 10,000 keys, got %d", first, after)
	}
	e.wantCount(10_000, acquireWait, "locker", "approval", "result", "acquired")
	e.wantCount(10_000, heldSeconds, "locker", "approval", "reason", "released")
	fams, _ := e.reg.Gather()
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if strings.Contains(lp.GetValue(), "job/") {
					t.Fatalf("a key leaked into label %s=%q of %s", lp.GetName(), lp.GetValue(), f.GetName())
				}
			}
		}
	}
}

// A caller that names lockers after keys is capped at MaxLockers names plus
// "other".
func TestCardinalityLockerNamesCapped(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := prommetrics.New(reg, prommetrics.Options{MaxLockers: 4})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10_000 {
		obs.Observe(leasehold.Event{Kind: leasehold.EventContention, Locker: fmt.Sprintf("job/%d", i)})
		obs.Observe(leasehold.Event{Kind: leasehold.EventStaleWrite, Locker: "approval", Op: fmt.Sprintf("table%d", i)})
	}
	if got, err := testutil.GatherAndCount(reg, contention); err != nil || got != 5 {
		t.Fatalf("expected 5 contention series (4 names + other), got %d (%v)", got, err)
	}
	if got, err := testutil.GatherAndCount(reg, staleWrites); err != nil || got != 5 {
		t.Fatalf("expected 5 stale-write series (4 names + other), got %d (%v)", got, err)
	}
	if got, err := testutil.GatherAndCount(reg); err != nil || got != 5*seriesPerLocker+5 {
		t.Fatalf("expected %d series in all, got %d (%v)", 5*seriesPerLocker+5, got, err)
	}
	if m := find(t, reg, staleWrites, "locker", prommetrics.OverflowLocker, "resource", prommetrics.OverflowLocker); m == nil || m.GetCounter().GetValue() != 10_000-4 {
		t.Fatalf("expected %d stale writes under other/other, got %v", 10_000-4, m)
	}
	m := find(t, reg, contention, "locker", prommetrics.OverflowLocker)
	if m == nil || m.GetCounter().GetValue() != 10_000-4 {
		t.Fatalf("expected %d contention events under locker=other, got %v", 10_000-4, m)
	}
}

func TestConcurrentObserve(t *testing.T) {
	e := newEnv(t)
	const workers, each = 8, 500
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			name := []string{"approval", "workflow"}[w%2]
			for range each {
				e.obs.Observe(leasehold.Event{Kind: leasehold.EventContention, Locker: name})
				e.obs.Observe(leasehold.Event{Kind: leasehold.EventAcquire, Locker: name, Result: leasehold.ResultAcquired, Duration: time.Millisecond})
			}
		})
	}
	wg.Wait()
	for _, name := range []string{"approval", "workflow"} {
		e.wantCounter(workers/2*each, contention, "locker", name)
		e.wantCount(workers/2*each, acquireWait, "locker", name, "result", "acquired")
	}
}

func TestNewValidates(t *testing.T) {
	for _, c := range []struct {
		name string
		opts prommetrics.Options
		want string
	}{
		{"namespace", prommetrics.Options{Namespace: "lease-hold"}, "Namespace"},
		{"decreasing", prommetrics.Options{WaitBuckets: []float64{1, 0.5}}, "WaitBuckets"},
		{"zero bucket", prommetrics.Options{HeldBuckets: []float64{0, 1}}, "HeldBuckets"},
		{"reserved label", prommetrics.Options{ConstLabels: map[string]string{"locker": "x"}}, "locker"},
		{"reserved resource", prommetrics.Options{ConstLabels: map[string]string{"resource": "x"}}, "resource"},
		{"max lockers", prommetrics.Options{MaxLockers: -1}, "MaxLockers"},
	} {
		_, err := prommetrics.New(prometheus.NewRegistry(), c.opts)
		if !errors.Is(err, prommetrics.ErrInvalidOptions) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: expected ErrInvalidOptions naming %s, got %v", c.name, c.want, err)
		}
	}
	if _, err := prommetrics.New(nil, prommetrics.Options{}); !errors.Is(err, prommetrics.ErrInvalidOptions) {
		t.Errorf("nil Registerer: expected ErrInvalidOptions, got %v", err)
	}
	reg := prometheus.NewRegistry()
	if _, err := prommetrics.New(reg, prommetrics.Options{}); err != nil {
		t.Fatal(err)
	}
	var are prometheus.AlreadyRegisteredError
	if _, err := prommetrics.New(reg, prommetrics.Options{}); !errors.As(err, &are) {
		t.Errorf("second New on one registry: expected AlreadyRegisteredError, got %v", err)
	}
}

func TestCustomNamespaceAndBuckets(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := prommetrics.New(reg, prommetrics.Options{
		Namespace:   "billing_locks",
		WaitBuckets: []float64{0.01, 0.1, 1},
		ConstLabels: map[string]string{"service": "billing"},
	})
	if err != nil {
		t.Fatal(err)
	}
	obs.Observe(leasehold.Event{Kind: leasehold.EventAcquire, Locker: "approval", Result: leasehold.ResultAcquired, Duration: 50 * time.Millisecond})
	m := find(t, reg, "billing_locks_acquire_wait_seconds", "locker", "approval", "result", "acquired", "service", "billing")
	if m == nil {
		t.Fatal("expected billing_locks_acquire_wait_seconds with service=billing")
	}
	b := m.GetHistogram().GetBucket()
	if len(b) != 3 || b[0].GetCumulativeCount() != 0 || b[1].GetCumulativeCount() != 1 {
		t.Fatalf("expected buckets 0.01/0.1/1 with the sample in 0.1, got %v", b)
	}
}

func TestLint(t *testing.T) {
	e := newEnv(t)
	e.obs.Observe(leasehold.Event{Kind: leasehold.EventContention, Locker: "approval"})
	e.obs.Observe(leasehold.Event{Kind: leasehold.EventStaleWrite, Locker: "approval", Op: "orders"})
	problems, err := testutil.GatherAndLint(e.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}
