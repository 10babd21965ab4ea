package leasehold_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
)

// deafStore is a store whose Renew, once deaf, blocks for a long time and
// ignores its context's deadline, as a go-redis client without
// ContextTimeoutEnabled does on a dead connection.
type deafStore struct {
	*memstore.Store
	mu   sync.Mutex
	deaf bool
	done chan struct{}
}

func (d *deafStore) Renew(ctx context.Context, key, token string, ttl time.Duration) error {
	d.mu.Lock()
	deaf := d.deaf
	d.mu.Unlock()
	if deaf {
		select {
		case <-time.After(2 * time.Second):
		case <-d.done:
		}
		return errors.New("deaf: connection reset")
	}
	return d.Store.Renew(ctx, key, token, ttl)
}

func TestGuardFiresWhileARenewalIgnoresItsDeadline(t *testing.T) {
	store := &deafStore{Store: memstore.New(), done: make(chan struct{})}
	defer close(store.done)
	const ttl = 400 * time.Millisecond
	l, _, _ := newLocker(t, store, leasehold.Options{TTL: ttl, RenewInterval: 50 * time.Millisecond, MaxRenewFailures: 100})
	lease, err := l.TryAcquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(120 * time.Millisecond) // a couple of good renewals
	store.mu.Lock()
	store.deaf = true
	store.mu.Unlock()
	deafAt := time.Now()
	waitDone(t, lease.Context(), 3*time.Second, "lease context")
	if cause := context.Cause(lease.Context()); !errors.Is(cause, leasehold.ErrLeaseExpired) {
		t.Fatalf("expected ErrLeaseExpired while the renewal hung, got %v", cause)
	}
	if el := time.Since(deafAt); el > ttl {
		t.Fatalf("expected the guard within the TTL (%v) of the last good renewal, fired %v after the store went deaf", ttl, el)
	}
	if _, err := store.Inspect(t.Context(), "k"); err != nil {
		t.Fatalf("expected the holder to learn of expiry before the store expired the key, got %v", err)
	}
}

// acquireAligned takes n leases whose renewals fall into one batch.
func slowBatches(store *memstore.Store, d time.Duration) {
	store.SetFaults(func(op memstore.Op, _ string) memstore.Fault {
		if op == memstore.OpRenewBatch {
			return memstore.Fault{Delay: d}
		}
		return memstore.Fault{}
	})
}

func TestReleaseDuringABatchDoesNotHurtPeers(t *testing.T) {
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
}

func TestCloseDuringABatchEndsLeasesAsClosed(t *testing.T) {
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
}

func TestLostAcquireReplyLeavesNoOrphanLock(t *testing.T) {
	for _, policy := range []leasehold.StorePolicy{leasehold.FailClosed, leasehold.FailOpen} {
		store := memstore.New()
		l, _, _ := newLocker(t, store, leasehold.Options{OnStoreError: policy})
		store.SetFaults(func(op memstore.Op, _ string) memstore.Fault {
			if op == memstore.OpAcquire {
				return memstore.Fault{DropReply: true}
			}
			return memstore.Fault{}
		})
		lease, err := l.TryAcquire(t.Context(), "k")
		switch policy {
		case leasehold.FailClosed:
			if !errors.Is(err, leasehold.ErrStore) {
				t.Fatalf("expected a store error, got %v", err)
			}
		case leasehold.FailOpen:
			if err != nil || !lease.Degraded() {
				t.Fatalf("expected a degraded lease, got %v, %v", lease, err)
			}
			defer lease.Release(t.Context())
		}
		store.SetFaults(nil)
		deadline := time.Now().Add(2 * time.Second)
		for {
			if _, err := store.Inspect(t.Context(), "k"); errors.Is(err, leasehold.ErrNotHeld) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%v: expected the lock whose reply was lost to be released, it is still held", policy)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

func TestNoFailOpenAfterContentionWasSeen(t *testing.T) {
	store := memstore.New()
	holder, _, _ := newLocker(t, store, leasehold.Options{})
	waiter, rec, _ := newLocker(t, store, leasehold.Options{OnStoreError: leasehold.FailOpen})
	held, err := holder.TryAcquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(t.Context())
	go func() {
		time.Sleep(100 * time.Millisecond)
		store.SetDown(true)
	}()
	lease, err := waiter.Acquire(withTimeout(t, 5*time.Second), "k")
	store.SetDown(false)
	if lease != nil || !errors.Is(err, leasehold.ErrStore) {
		t.Fatalf("expected the store error, not a degraded lease, after another owner was seen: %v, %v", lease, err)
	}
	if n := rec.count(leasehold.EventFailOpen); n != 0 {
		t.Fatalf("expected no fail-open, got %d", n)
	}
}

func TestCloseWakesWaitingAcquires(t *testing.T) {
	store := memstore.New()
	holder, _, _ := newLocker(t, store, leasehold.Options{})
	l, err := leasehold.New(store, leasehold.Options{WaitCap: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	held, err := holder.TryAcquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(t.Context())
	errs := make(chan error, 2)
	for range 2 { // one waits in the store loop, the other on the local gate
		go func() {
			_, err := l.Acquire(context.Background(), "k")
			errs <- err
		}()
	}
	time.Sleep(100 * time.Millisecond)
	_ = l.Close()
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, leasehold.ErrLockerClosed) {
				t.Fatalf("expected ErrLockerClosed, got %v", err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("expected Close to wake every waiting Acquire")
		}
	}
}

type runIDKey struct{}

// runIDHandler adds the run id found in a record's context, as a service's
// own slog handler would.
type runIDHandler struct{ slog.Handler }

func (h runIDHandler) Handle(ctx context.Context, r slog.Record) error {
	if id, ok := ctx.Value(runIDKey{}).(string); ok {
		r.AddAttrs(slog.String("run_id", id))
	}
	return h.Handler.Handle(ctx, r)
}

func (h runIDHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return runIDHandler{h.Handler.WithAttrs(as)}
}

func TestLogRecordsCarryTheAcquireContext(t *testing.T) {
	store := memstore.New()
	logs := &syncBuffer{}
	l, _, _ := newLocker(t, store, leasehold.Options{TTL: time.Second, RenewInterval: 20 * time.Millisecond,
		Logger: slog.New(runIDHandler{slog.NewTextHandler(logs, nil)})})
	ctx := context.WithValue(t.Context(), runIDKey{}, "run-7")
	lease, err := l.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.ForceRelease(t.Context(), "job"); err != nil {
		t.Fatal(err)
	}
	waitDone(t, lease.Context(), time.Second, "lease")
	if !strings.Contains(logs.String(), "leasehold: lease lost") || !strings.Contains(logs.String(), "run_id=run-7") {
		t.Fatalf("expected the loss logged with the acquire context's run id, got %q", logs)
	}
}
