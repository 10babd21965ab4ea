package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

// waiterRows counts the rows of the default waiter table for key: queue
// entries and subscriptions.
func waiterRows(t *testing.T, db *pgxpool.Pool, key string) (queued, subs int) {
	t.Helper()
	err := db.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE queued), count(*) FILTER (WHERE NOT queued)
FROM public.leasehold_locks_waiters WHERE key = $1`, key).Scan(&queued, &subs)
	if err != nil {
		t.Fatal(err)
	}
	return queued, subs
}

// #11 item 2: a release hands the key to the head of its queue in the same
// statement (the head's token, holder and TTL, a larger fence), wakes that
// waiter, and the head's next Acquire returns that grant. A newcomer cannot
// take the key in between.
func TestReleaseGrantsTheHead(t *testing.T) {
	_, dsn := fresh(t)
	h, w := open(t, dsn, pgstore.Options{}), open(t, dsn, pgstore.Options{})
	ctx := ctx5(t)
	f1, err := h.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "h", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	req := driver.AcquireRequest{Key: "k", Token: "w", TTL: 30 * time.Second, Holder: "host-w", QueueTTL: time.Minute}
	if _, err := w.Acquire(ctx, req); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("waiter: expected ErrNotAcquired, got %v", err)
	}
	wake, stop, err := w.WaitRelease(ctx, "k", "w")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	drainAtOnce(wake)
	if err := h.Release(ctx, "k", "h"); err != nil {
		t.Fatal(err)
	}
	info := expectGranted(t, h, f1.Fence)
	if _, err := h.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "newcomer", TTL: time.Minute}); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("a newcomer after the grant: expected ErrNotAcquired, got %v", err)
	}
	if !wokeWithin(wake, 3*time.Second) {
		t.Fatal("the head was not woken by the grant")
	}
	g, err := w.Acquire(ctx, req)
	if err != nil || g.Fence != info.Fence {
		t.Fatalf("the head's Acquire after the grant: expected fence %d, got %+v, %v", info.Fence, g, err)
	}
	if err := w.Release(ctx, "k", "w"); err != nil {
		t.Fatal(err)
	}
}

// expectGranted checks that k is held by w (host-w) with a fence above
// after, about 30 s left and nobody queued, and returns what it saw.
func expectGranted(t *testing.T, s *pgstore.Store, after uint64) driver.LockInfo {
	t.Helper()
	info, err := s.Inspect(ctx5(t), "k")
	if err != nil || info.Token != "w" || info.Holder != "host-w" || info.Fence <= after ||
		info.Remaining <= 20*time.Second || info.Remaining > 30*time.Second || info.Waiting != 0 {
		t.Fatalf("after the release: expected the key granted to w (host-w, fence > %d, ~30s left, queue empty), got %+v, %v", after, info, err)
	}
	return info
}

// A WaitRelease subscription row (a token that did not queue, or an
// observer) is deleted when its subscriber stops, not 5 minutes later; a
// token this store queued writes none; one store's observers do not delete
// another's row.
func TestSubscriptionRowsEndWithTheirWaiter(t *testing.T) {
	_, dsn := fresh(t)
	db := testpg.Connect(t, dsn, pgxpool.New)
	s1, s2 := open(t, dsn, pgstore.Options{}), open(t, dsn, pgstore.Options{})
	ctx := ctx5(t)
	if _, err := s1.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "q", TTL: time.Minute, QueueTTL: time.Minute}); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatal(err)
	}
	subscribe := func(s *pgstore.Store, tok string) func() {
		_, stop, err := s.WaitRelease(ctx, "k", tok)
		if err != nil {
			t.Fatal(err)
		}
		return stop
	}
	stopQ := subscribe(s2, "q") // queued by s2: no row
	stopX := subscribe(s1, "x") // not queued: a row
	stopO1, stopO2 := subscribe(s1, ""), subscribe(s1, "")
	stopO3 := subscribe(s2, "")
	if q, subs := waiterRows(t, db, "k"); q != 1 || subs != 3 {
		t.Fatalf("expected 1 queue entry and 3 subscription rows (x, one observer row per store), got %d and %d", q, subs)
	}
	defer stopO3()
	stopQ()
	stopX()
	stopO1()
	stopO2()
	deadline := time.Now().Add(3 * time.Second)
	for {
		q, subs := waiterRows(t, db, "k")
		if q == 1 && subs == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("3s after the subscribers stopped: expected the queue entry and s2's observer row, got %d and %d rows", q, subs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A waiter that subscribed before it queued keeps its place only for its
// queue TTL: the subscription row (5 minutes) does not extend the queue
// entry it becomes, so a dead waiter cannot hold up the queue for minutes.
func TestSubscriptionDoesNotExtendQueueEntry(t *testing.T) {
	_, dsn := fresh(t)
	db := testpg.Connect(t, dsn, pgxpool.New)
	s := open(t, dsn, pgstore.Options{})
	ctx := ctx5(t)
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	_, stop, err := s.WaitRelease(ctx, "k", "w")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "w", TTL: time.Minute, QueueTTL: time.Second}); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatal(err)
	}
	var left time.Duration
	if err := db.QueryRow(ctx, `SELECT expires_at - clock_timestamp() FROM public.leasehold_locks_waiters WHERE key = 'k' AND token = 'w' AND queued`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left > time.Second {
		t.Fatalf("a queue entry with a 1s queue TTL, after a subscription of the same token: expected <= 1s left, got %v", left)
	}
}

// A waiter queued while its store's LISTEN connection was up misses no
// release between its queued Acquire and its WaitRelease: a grant that came
// in between is kept, and WaitRelease's channel carries it at once. Without
// a queued Acquire sent while the connection was up, WaitRelease puts a
// plain wake-up on the channel at once.
func TestResumesAfterQueuedAcquire(t *testing.T) {
	srv := testpg.Start(t)
	dsn := srv.CreateDatabase(t)
	h, s := open(t, dsn, pgstore.Options{}), open(t, dsn, pgstore.Options{})
	ctx := ctx5(t)
	queue := func(tok string) {
		t.Helper()
		_, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: tok, TTL: time.Minute, QueueTTL: time.Minute})
		if !errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("queued Acquire: expected ErrNotAcquired, got %v", err)
		}
	}
	if _, err := h.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "h1", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	queue("w0")                                       // the LISTEN connection is not up yet
	wake0, stop, err := s.WaitRelease(ctx, "k", "w0") // starts it
	if err != nil {
		t.Fatal(err)
	}
	select {
	case w := <-wake0:
		if w != (driver.Wake{}) {
			t.Fatalf("the wake-up at once: expected a zero driver.Wake, got %+v", w)
		}
	default:
		t.Fatal("WaitRelease of a waiter queued before the LISTEN connection was up: expected a wake-up at once")
	}
	stop()
	if err := s.Release(ctx, "k", "w0"); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("the waiter leaves: expected ErrNotOwned, got %v", err)
	}
	queue("w1")
	if err := h.Release(ctx, "k", "h1"); err != nil { // grants w1 before it subscribes
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the grant's notification arrives first
	wake, stop, err := s.WaitRelease(ctx, "k", "w1")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	select {
	case g := <-wake:
		if g.TTL != time.Minute || g.Fence == 0 {
			t.Fatalf("the kept grant: expected one for a minute, got %+v", g)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("WaitRelease after a grant that came before it: expected an immediate wake-up")
	}
	if err := s.Release(ctx, "k", "w1"); err != nil {
		t.Fatalf("the granted waiter releases: %v", err)
	}
}
