package drill

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/memstore"
)

// batchCounter is a memory store that counts batched renewals.
type batchCounter struct {
	*memstore.Store
	batches atomic.Int64
}

func (b *batchCounter) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []error {
	b.batches.Add(1)
	return b.Store.RenewBatch(ctx, reqs)
}

// The replicas' store wrapper forwards every optional capability: a Locker
// over it renews several leases in one batch on the store underneath (issue
// 13: the wrapper used to hide RenewBatch, so the drill never exercised
// batched renewal).
func TestProcStoreForwardsBatchRenewal(t *testing.T) {
	inner := &batchCounter{Store: memstore.New()}
	ps, err := newProcStore(inner, testSession(t), func(error) bool { return false }, 0)
	if err != nil {
		t.Fatal(err)
	}
	var st driver.Store = ps
	for name, ok := range map[string]bool{
		"Inspector":     is[driver.Inspector](st),
		"Notifier":      is[driver.Notifier](st),
		"BatchRenewer":  is[driver.BatchRenewer](st),
		"ForceReleaser": is[driver.ForceReleaser](st),
	} {
		if !ok {
			t.Errorf("expected the wrapper to be a %s", name)
		}
	}
	l, err := leasehold.New(st, leasehold.Options{Name: "batch", TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, k := range []string{"a", "b", "c"} {
		if _, err := l.TryAcquire(t.Context(), k); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for inner.batches.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("expected the Locker to renew its leases in a batch through the wrapper, saw none")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := st.(driver.ForceReleaser).ForceRelease(t.Context(), "a"); err != nil {
		t.Fatalf("ForceRelease through the wrapper: %v", err)
	}
}

func is[T any](v any) bool { _, ok := v.(T); return ok }

// testSession is the session of replica 0 of a drill with the defaults.
func testSession(t *testing.T) *session {
	cfg, err := Config{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	d := newDrill(cfg)
	return d.newSession(t.Context(), d.replicas[0], &incarnation{})
}

// A store without every optional capability is refused, not silently
// narrowed.
func TestProcStoreRefusesPartialStore(t *testing.T) {
	type plain struct{ driver.Store }
	_, err := newProcStore(plain{memstore.New()}, testSession(t), func(error) bool { return false }, 0)
	if !errors.Is(err, ErrSetup) {
		t.Fatalf("expected ErrSetup for a store without optional capabilities, got %v", err)
	}
}

// A release through the wrapper is recorded as a possible grant of its key:
// a store that grants on release starts the queue head's
// lock then, with no call of the head's token, so the stuck-lock sampler
// must count from it (CI saw "lock still held 425ms after its last applied
// acquire/renew" on such a grant). A release that never reached the store
// (the process is dead) is not.
func TestReleaseIsAPossibleGrant(t *testing.T) {
	s := testSession(t)
	rec := s.d.rec
	ps, err := newProcStore(memstore.New(), s, func(error) bool { return false }, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := ps.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "a", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	if got := rec.lastGrant("k"); got != 0 {
		t.Fatalf("expected no possible grant before a release, got one at %v", got)
	}
	before := rec.since()
	if err := ps.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	if got := rec.lastGrant("k"); got < before {
		t.Fatalf("expected the release (sent at %v or later) to count as a possible grant of k, got %v", before, got)
	}
	if got := rec.lastGrant("other"); got != 0 {
		t.Fatalf("expected no possible grant of a key nobody released, got %v", got)
	}
	ps.kill()
	if err := ps.Release(ctx, "dead", "b"); !errors.Is(err, errProcessDead) {
		t.Fatalf("expected errProcessDead from a dead process's release, got %v", err)
	}
	if got := rec.lastGrant("dead"); got != 0 {
		t.Fatalf("expected a release that never reached the store not to count, got %v", got)
	}
}

// refreshCounter is a memory store that counts batched queue refreshes.
type refreshCounter struct {
	*memstore.Store
	refreshes atomic.Int64
}

func (r *refreshCounter) RefreshQueue(ctx context.Context, reqs []driver.QueueRefresh) []error {
	r.refreshes.Add(1)
	return r.Store.RefreshQueue(ctx, reqs)
}

// A waiting Locker over the wrapper keeps its queue place with batched
// refreshes, as in production: the wrapper used to hide RefreshQueue, so the
// drill's waiters re-sent a full Acquire each interval instead.
func TestProcStoreForwardsQueueRefresh(t *testing.T) {
	inner := &refreshCounter{Store: memstore.New()}
	ps, err := newProcStore(inner, testSession(t), func(error) bool { return false }, 0)
	if err != nil {
		t.Fatal(err)
	}
	opts := leasehold.Options{Name: "refresh", TTL: 5 * time.Second, WaiterTTL: 300 * time.Millisecond, WaitCap: 100 * time.Millisecond}
	holder, err := leasehold.New(inner.Store, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.TryAcquire(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	waiter, err := leasehold.New(ps.forLocker(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { _, err := waiter.Acquire(ctx, "k"); done <- err }()
	deadline := time.Now().Add(5 * time.Second)
	for inner.refreshes.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("expected the waiting Acquire to end with its context, got %v", err)
	}
	if inner.refreshes.Load() == 0 {
		t.Fatal("expected the waiter to keep its place with RefreshQueue through the wrapper, saw none in 5 s")
	}
}

// The memory backend's lost-reply fault drops the replies of every call
// that changes the store: batched renewals (how a Locker renews several
// leases) and the permit calls of the semaphore workload too, not only
// single lock calls, or those workloads never see a lost reply.
func TestMemBackendDropsEveryChangingReply(t *testing.T) {
	m := newMemBackend(func() float64 { return 0 }, time.Second)
	m.dropReplies(1)
	ctx := t.Context()
	lost := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, memstore.ErrReplyLost) {
			t.Errorf("%s: expected ErrReplyLost, got %v", what, err)
		}
	}
	_, err := m.mem.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Minute})
	lost("Acquire", err)
	lost("RenewBatch", m.mem.RenewBatch(ctx, []driver.RenewRequest{{Key: "k", Token: "t", TTL: time.Minute}})[0])
	_, err = m.mem.AcquirePermit(ctx, driver.PermitRequest{Key: "s", Token: "t", TTL: time.Minute, Limit: 1})
	lost("AcquirePermit", err)
	lost("RenewPermit", m.mem.RenewPermit(ctx, "s", "t", time.Minute))
	lost("ReleasePermit", m.mem.ReleasePermit(ctx, "s", "t"))
	m.dropReplies(0)
	if info, err := m.mem.Permits(ctx, "s"); err != nil || len(info.Holders) != 0 {
		t.Errorf("expected the dropped ReleasePermit applied, got %+v, %v", info, err)
	}
}

// The memory backend marks a restart before the data is gone: a waiter
// woken by the restart can take the key and return at once, and a mark taken
// after that would leave its overlap with the old holder unexplained (the
// election drill then reported two trusted leaders).
func TestMemBackendMarksRestartBeforeTheLoss(t *testing.T) {
	m := newMemBackend(func() float64 { return 0 }, time.Second)
	ctx := t.Context()
	if _, err := m.mem.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	held := false
	if err := m.restart(func() {
		info, err := m.mem.Inspect(ctx, "k")
		held = err == nil && info.Token == "t"
	}); err != nil {
		t.Fatal(err)
	}
	if !held {
		t.Error("expected the mark before the restart lost the lock, it came after")
	}
	if info, err := m.mem.Inspect(ctx, "k"); err == nil && info.Token != "" {
		t.Errorf("expected the restart to lose the lock, still held: %+v", info)
	}
}
