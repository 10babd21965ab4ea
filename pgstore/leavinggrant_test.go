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

// #27 (3): a waiter that gives up (Release with its token) while the
// holder's release is granting it the key must not leave the key granted to
// nobody who lives. The test holds the head's queue row locked so that the
// holder's release stops after its grant, before it commits; the leaving
// waiter's release then runs against that uncommitted grant. Once both
// committed, the key must be free.
func TestWaiterLeavingAsItIsGrantedLeavesTheKeyFree(t *testing.T) {
	srv := testpg.Start(t)
	holder := open(t, srv.DSN(), pgstore.Options{})
	waiter := open(t, srv.DSN(), pgstore.Options{})
	admin := testpg.Connect(t, srv.DSN(), pgxpool.New)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const key = "leaving"
	if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	_, err := waiter.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "w", TTL: time.Minute, QueueTTL: time.Minute})
	if !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("waiting Acquire of a held key: expected ErrNotAcquired, got %v", err)
	}

	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM leasehold_locks_waiters WHERE key = $1 AND token = 'w' FOR UPDATE`, key); err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() { released <- holder.Release(ctx, key, "h") }()
	waitBlocked(t, admin, 1) // the holder's release granted "w" and waits for the queue row
	left := make(chan error, 1)
	go func() { left <- waiter.Release(ctx, key, "w") }()
	time.Sleep(200 * time.Millisecond) // the leaving release runs as far as it can
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-released; err != nil {
		t.Fatalf("holder's Release: %v", err)
	}
	if err := <-left; err != nil && !errors.Is(err, leasehold.ErrNotHeld) && !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("waiter's Release: %v", err)
	}
	info, err := holder.Inspect(ctx, key)
	if !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("expected the key free once the waiter that was granted it left, got %+v, %v", info, err)
	}
}

// waitBlocked waits until n backends wait for a lock.
func waitBlocked(t *testing.T, admin *pgxpool.Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var got int
		err := admin.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'`).Scan(&got)
		if err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("expected %d backend(s) waiting for a lock within 10 s, got %d", n, got)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
