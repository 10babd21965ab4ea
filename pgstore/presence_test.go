package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

// waiting returns how many live waiters key has, by Inspect (the key is
// held).
func waiting(t *testing.T, s *pgstore.Store, key string) int {
	t.Helper()
	info, err := s.Inspect(ctx5(t), key)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	return info.Waiting
}

// lockCapped reports whether key's lock row ends no later than the presence
// of the store whose channel is wake.
func lockCapped(t *testing.T, db *pgxpool.Pool, key, wake string) bool {
	t.Helper()
	var capped bool
	if err := db.QueryRow(ctx5(t), `SELECT l.expires_at <= p.expires_at FROM public.leasehold_locks l, public.leasehold_locks_presence p
WHERE l.key = $1 AND p.wake = $2`, key, wake).Scan(&capped); err != nil {
		t.Fatal(err)
	}
	return capped
}

// A place queued with Kept lives past its QueueTTL while its Store keeps
// its presence, ends with the presence, and a grant to it is capped at the
// presence's end.
func TestPresenceKeepsPlaces(t *testing.T) {
	_, dsn := fresh(t)
	holder, waiter := open(t, dsn, pgstore.Options{}), open(t, dsn, pgstore.Options{})
	db := testpg.Connect(t, dsn, pgxpool.New)
	ctx := ctx5(t)
	const key, qttl, presence = "present", 200 * time.Millisecond, 400 * time.Millisecond
	if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := waiter.KeepPresence(ctx, presence); err != nil {
		t.Fatal(err)
	}
	req := driver.AcquireRequest{Key: key, Token: "w", TTL: 10 * time.Second, QueueTTL: qttl, Kept: time.Minute}
	if _, err := waiter.Acquire(ctx, req); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	for range 6 { // 600 ms: three QueueTTLs
		time.Sleep(qttl / 2)
		if err := waiter.KeepPresence(ctx, presence); err != nil {
			t.Fatal(err)
		}
	}
	if n := waiting(t, holder, key); n != 1 {
		t.Fatalf("expected the place kept by the presence past its QueueTTL, got %d waiting", n)
	}

	// A release hands the key over capped at the presence's end.
	if err := holder.Release(ctx, key, "h"); err != nil {
		t.Fatal(err)
	}
	if info, err := holder.Inspect(ctx, key); err != nil || info.Token != "w" {
		t.Fatalf("expected the key handed to the kept place, got %+v, %v", info, err)
	}
	if !lockCapped(t, db, key, waiter.WakeChannel()) {
		t.Error("expected the grant capped at the presence's end")
	}

	// Once the presence ends, so does a kept place.
	if err := waiter.Release(ctx, key, "w"); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "h2", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := waiter.Acquire(ctx, req); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for waiting(t, holder, key) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("expected the kept place gone with the presence (%v), still queued after 10s (Kept %v)", presence, req.Kept)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if errs := waiter.RefreshQueue(ctx, []driver.QueueRefresh{{Key: key, Token: "w", QueueTTL: qttl, Kept: time.Minute}}); !errors.Is(errs[0], driver.ErrNotQueued) {
		t.Errorf("RefreshQueue of a place whose presence ended: expected ErrNotQueued, got %v", errs[0])
	}
}

// A release skips a kept head whose presence ended, as it skips a dead
// place, and grants the key to the live waiter behind it.
func TestPresenceDeadKeptHeadSkipped(t *testing.T) {
	_, dsn := fresh(t)
	holder, gone, live := open(t, dsn, pgstore.Options{}), open(t, dsn, pgstore.Options{}), open(t, dsn, pgstore.Options{})
	ctx := ctx5(t)
	const key = "dead-head"
	if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := gone.KeepPresence(ctx, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, err := gone.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "g", TTL: time.Minute, QueueTTL: time.Minute, Kept: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	if _, err := live.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "l", TTL: time.Minute, QueueTTL: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	time.Sleep(300 * time.Millisecond) // the presence ends, never kept again
	if err := holder.Release(ctx, key, "h"); err != nil {
		t.Fatal(err)
	}
	if info, err := holder.Inspect(ctx, key); err != nil || info.Token != "l" {
		t.Fatalf("expected the key granted to the live waiter behind the dead kept head, got %+v, %v", info, err)
	}
}

// An acquire that finds the key free and a kept place at the head hands the
// key to the head, as a release would: the head may be a place its process
// forgot, which would otherwise stall the queue for its whole Kept.
func TestPresenceAcquireHandsAFreeKeyToAKeptHead(t *testing.T) {
	_, dsn := fresh(t)
	holder, forgot, other := open(t, dsn, pgstore.Options{}), open(t, dsn, pgstore.Options{}), open(t, dsn, pgstore.Options{})
	db := testpg.Connect(t, dsn, pgxpool.New)
	ctx := ctx5(t)
	const key = "forgotten"
	if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "h", TTL: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := forgot.KeepPresence(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{forgot.WakeChannel()}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if _, err := forgot.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "f", TTL: 5 * time.Second, QueueTTL: time.Second, Kept: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	time.Sleep(400 * time.Millisecond) // the holder's lock expires; nobody releases
	g, err := other.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "o", TTL: 5 * time.Second, QueueTTL: time.Second})
	if !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired behind the kept head, got %v", err)
	}
	if info, err := holder.Inspect(ctx, key); err != nil || info.Token != "f" {
		t.Fatalf("expected the free key handed to the kept head f, got %+v, %v", info, err)
	}
	if g.Remaining <= 0 || g.Remaining > 5*time.Second || g.Ahead != 0 {
		t.Errorf("expected the acquirer next in line with the grant's TTL to time, got %+v", g)
	}
	if !lockCapped(t, db, key, forgot.WakeChannel()) {
		t.Error("expected the grant capped at the presence's end")
	}
	n, err := conn.WaitForNotification(ctx)
	if err != nil || !strings.HasPrefix(n.Payload, "g1:f") {
		t.Errorf("expected the grant notified to the head's store, got %+v, %v", n, err)
	}
}

// An acquire or refresh without Kept that lands after one with Kept leaves
// the place kept, its deadline where it was.
func TestPresenceUnkeptWriteNeverShortensAKeptPlace(t *testing.T) {
	_, dsn := fresh(t)
	holder, waiter := open(t, dsn, pgstore.Options{}), open(t, dsn, pgstore.Options{})
	db := testpg.Connect(t, dsn, pgxpool.New)
	ctx := ctx5(t)
	const key = "unkept-late"
	if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := waiter.KeepPresence(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	row := func() (deadline time.Time, kept bool) {
		t.Helper()
		if err := db.QueryRow(ctx, `SELECT expires_at, kept FROM public.leasehold_locks_waiters WHERE key = $1 AND token = 'w'`, key).Scan(&deadline, &kept); err != nil {
			t.Fatal(err)
		}
		return deadline, kept
	}
	req := driver.AcquireRequest{Key: key, Token: "w", TTL: time.Second, QueueTTL: 100 * time.Millisecond, Kept: time.Minute}
	if _, err := waiter.Acquire(ctx, req); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	d0, k0 := row()
	if !k0 || time.Until(d0) < 30*time.Second {
		t.Fatalf("expected a place kept for Kept, got deadline in %v, kept %v", time.Until(d0), k0)
	}
	req.Kept = 0
	if _, err := waiter.Acquire(ctx, req); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	if errs := waiter.RefreshQueue(ctx, []driver.QueueRefresh{{Key: key, Token: "w", QueueTTL: req.QueueTTL}}); errs[0] != nil {
		t.Fatalf("RefreshQueue: %v", errs[0])
	}
	if d, k := row(); !k || !d.Equal(d0) {
		t.Errorf("expected the kept place left as it was (deadline %v), got deadline %v, kept %v", d0, d, k)
	}
	time.Sleep(3 * req.QueueTTL)
	if n := waiting(t, holder, key); n != 1 {
		t.Errorf("expected the kept place to outlive QueueTTL, got %d waiting", n)
	}
}

// A kept acquire whose presence is gone (lost with the UNLOGGED table, or
// lapsed) re-creates it for the queue TTL, so that the place is live at
// once.
func TestPresenceRecreatedByAKeptAcquire(t *testing.T) {
	_, dsn := fresh(t)
	holder, waiter := open(t, dsn, pgstore.Options{}), open(t, dsn, pgstore.Options{})
	ctx := ctx5(t)
	const key = "recreated"
	if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	req := driver.AcquireRequest{Key: key, Token: "w", TTL: time.Second, QueueTTL: time.Second, Kept: time.Minute}
	if _, err := waiter.Acquire(ctx, req); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	if n := waiting(t, holder, key); n != 1 {
		t.Fatalf("expected the kept place live with no presence kept yet, got %d waiting", n)
	}
}

// KeepPresence deletes presences gone for over an hour, not younger ones.
func TestPresenceGarbageRemoved(t *testing.T) {
	_, dsn := fresh(t)
	s := open(t, dsn, pgstore.Options{})
	db := testpg.Connect(t, dsn, pgxpool.New)
	ctx := ctx5(t)
	if _, err := db.Exec(ctx, `INSERT INTO public.leasehold_locks_presence (wake, expires_at)
VALUES ('old', now() - interval '2 hours'), ('recent', now() - interval '10 minutes')`); err != nil {
		t.Fatal(err)
	}
	if err := s.KeepPresence(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	var left []string
	rows, err := db.Query(ctx, `SELECT wake FROM public.leasehold_locks_presence ORDER BY wake`)
	if err != nil {
		t.Fatal(err)
	}
	if left, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if want := []string{s.WakeChannel(), "recent"}; strings.Join(left, ",") != strings.Join(want, ",") {
		t.Errorf("expected presences %v, got %v", want, left)
	}
}

// A store without a LISTEN connection has no channel of its own, hence no
// presence.
func TestPresenceUnsupportedWithoutListener(t *testing.T) {
	_, dsn := fresh(t)
	db := testpg.Connect(t, dsn, pgxpool.New)
	s, err := pgstore.New(ctx5(t), struct{ pgstore.DB }{db}, pgstore.Options{Migrate: pgstore.MigrateCreate})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.KeepPresence(ctx5(t), time.Second); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("expected errors.ErrUnsupported, got %v", err)
	}
}
