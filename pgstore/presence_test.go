package pgstore_test

import (
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
