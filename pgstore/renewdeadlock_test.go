package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

// A renewal batch takes the rows of its keys in the order the release (and
// acquire) batches do, by key, so the two never deadlock: here a release
// batch of a and b waits for a's row (another transaction holds it), and a
// renewal batch of b and a, sent after it, must not hold b's row while it
// waits for a's too.
func TestRenewBatchAndReleaseBatchDoNotDeadlock(t *testing.T) {
	srv, dsn := fresh(t)
	s := open(t, dsn, pgstore.Options{})
	pool := testpg.Connect(t, dsn, pgxpool.New)
	admin := testpg.Connect(t, srv.DSN(), pgxpool.New)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, k := range []string{"a", "b"} {
		if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: k, Token: "t", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, "SELECT 1 FROM leasehold_locks WHERE key = 'a' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() {
		var res []int32
		released <- pool.QueryRow(ctx, pgstore.ReleaseBatchSQL(s), []string{"a", "b"}, []string{"t", "t"}, s.Channel(), false).Scan(&res)
	}()
	waitBlocked(t, admin, 1)
	renewed := make(chan []error, 1)
	go func() {
		renewed <- s.RenewBatch(ctx, []driver.RenewRequest{{Key: "b", Token: "t", TTL: time.Minute}, {Key: "a", Token: "t", TTL: time.Minute}})
	}()
	waitBlocked(t, admin, 2)
	// The renewal batch waits for a's row: it must not hold b's, which the
	// release batch takes next (a deadlock, broken after deadlock_timeout).
	probe, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := probe.Exec(ctx, "SELECT 1 FROM leasehold_locks WHERE key = 'b' FOR UPDATE NOWAIT"); err != nil {
		t.Errorf("expected b's row free while the renewal batch waits for a's, got %v", err)
	}
	_ = probe.Rollback(ctx)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-released; err != nil {
		t.Fatalf("release batch: %v", err)
	}
	<-renewed
}
