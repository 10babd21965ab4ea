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

// An observer that subscribes while the first acquire of a key creates its
// row is woken by the holder's release. The acquire (the store's own
// statement, in a transaction held open) inserted the row, marked not
// waited for, before the subscription; the subscription committed before
// the acquire did. Unless the subscription waits for that acquire, it
// cannot mark the row it does not see, and the holder's release takes the
// plain path, which notifies nobody.
func TestObserverSubscribedAsTheRowIsCreatedIsWoken(t *testing.T) {
	_, dsn := fresh(t)
	s := open(t, dsn, pgstore.Options{})
	pool := testpg.Connect(t, dsn, pgxpool.New)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	const key = "creating"
	_, stop, err := s.WaitRelease(ctx, "warm-up", "") // the LISTEN connection is up
	if err != nil {
		t.Fatal(err)
	}
	stop()

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var won bool
	var fence, rem int64
	var holder string
	var ahead int32
	err = tx.QueryRow(ctx, pgstore.AcquireSQL(s), key, "h", time.Minute.Microseconds(), "", int64(0), false, s.Channel(), s.WakeChannel(), int64(0)).
		Scan(&won, &fence, &rem, &holder, &ahead)
	if err != nil || !won {
		t.Fatalf("the acquire in a transaction: expected the key, got won %v, %v", won, err)
	}
	type sub struct {
		wake <-chan driver.Wake
		stop func()
		err  error
	}
	subscribed := make(chan sub, 1)
	go func() {
		w, stop, err := s.WaitRelease(ctx, key, "")
		subscribed <- sub{w, stop, err}
	}()
	// Let the subscription run as far as it can: to its end, or to a wait
	// for the acquire's locks.
	var o sub
	got := false
	for waiting := 0; !got && waiting == 0; time.Sleep(time.Millisecond) {
		select {
		case o = <-subscribed:
			got = true
		default:
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()").Scan(&waiting); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !got {
		o = <-subscribed
	}
	if o.err != nil {
		t.Fatalf("WaitRelease: %v", o.err)
	}
	defer o.stop()
	if err := s.Release(ctx, key, "h"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	select {
	case <-o.wake:
	case <-time.After(3 * time.Second):
		t.Fatal("expected the observer woken by the release within 3 s, got nothing")
	}
}
