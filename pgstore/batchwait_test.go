package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

// An acquire that sends a shared statement returns when its own context
// ends, not when the statement does: here the statement waits for another
// call's key (its advisory lock held by a transaction), and that call's
// context lasts. The statement goes on while that call waits for it, and
// ends once it gave up too (neither call has a deadline).
func TestBatchSenderReturnsAtItsOwnContext(t *testing.T) {
	_, dsn := fresh(t)
	s := open(t, dsn, pgstore.Options{})
	pool := testpg.Connect(t, dsn, pgxpool.New)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	blocked := []string{"b0", "b1", "b2", "b3", "slow"}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext(k)) FROM unnest($2::text[]) AS k", pgstore.LockClass(s), blocked); err != nil {
		t.Fatal(err)
	}
	acquire := func(ctx context.Context, key string) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "t-" + key, TTL: time.Minute})
			done <- err
		}()
		return done
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("expected %s within 10 s", what)
			}
		}
	}
	advisoryWaits := func(n int) func() bool {
		return func() bool {
			var waiting int
			err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' AND datname = current_database()").Scan(&waiting)
			return err == nil && waiting == n
		}
	}
	// Four statements in flight (every slot), one at a time.
	ctx0, cancel0 := context.WithCancel(ctx)
	defer cancel0()
	first := acquire(ctx0, "b0")
	waitFor("b0 waiting", advisoryWaits(1))
	var rest []<-chan error
	for i, k := range blocked[1:4] {
		rest = append(rest, acquire(ctx, k))
		waitFor(k+" waiting", advisoryWaits(i+2))
	}
	// Then "a" (a short context) waits for a slot, and "slow" behind it.
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	a := acquire(actx, "a")
	waitFor("a pending", func() bool { return pgstore.PendingAcquires(s) == 1 })
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	slow := acquire(sctx, "slow")
	waitFor("slow pending", func() bool { return pgstore.PendingAcquires(s) == 2 })
	// A slot frees: "a" takes it and sends "a" and "slow" in one statement,
	// which waits for slow's key.
	cancel0()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("b0: expected context.Canceled, got %v", err)
	}
	waitFor("the shared statement waiting", func() bool { return pgstore.PendingAcquires(s) == 0 && advisoryWaits(4)() })
	acancel()
	select {
	case err := <-a:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("a: expected context.Canceled, got %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("a: expected Acquire to return when its context ended, it still waits for a statement shared with a call whose context lasts")
		defer func() { <-a }()
	}
	// a's end did not cancel the statement slow waits for; slow's does.
	time.Sleep(100 * time.Millisecond)
	if !advisoryWaits(4)() {
		t.Error("expected the shared statement to go on while slow waits for it")
	}
	scancel()
	if err := <-slow; !errors.Is(err, context.Canceled) {
		t.Errorf("slow: expected context.Canceled, got %v", err)
	}
	waitFor("the shared statement to end once every call in it gave up", advisoryWaits(3))
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range rest {
		if err := <-c; err != nil {
			t.Errorf("b1..b3: expected them acquired, got %v", err)
		}
	}
}
