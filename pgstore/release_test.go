package pgstore_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

// Concurrent releases go in shared statements; each still gets its own
// answer: nil, ErrNotOwned (another token holds the key, left alone) or
// ErrNotHeld.
func TestConcurrentReleasesGetTheirOwnAnswers(t *testing.T) {
	_, dsn := fresh(t)
	s := open(t, dsn, pgstore.Options{})
	ctx := ctx5(t)
	const n = 100
	for i := range n {
		if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: fmt.Sprint("k", i), Token: "a", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	type release struct {
		key, token string
		want       error
	}
	var rs []release
	for i := range n {
		switch i % 3 {
		case 0:
			rs = append(rs, release{fmt.Sprint("k", i), "a", nil})
		case 1:
			rs = append(rs, release{fmt.Sprint("k", i), "b", leasehold.ErrNotOwned})
		default:
			rs = append(rs, release{fmt.Sprint("free", i), "a", leasehold.ErrNotHeld})
		}
	}
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Release(ctx, r.key, r.token); !errors.Is(err, r.want) || (r.want == nil && err != nil) {
				t.Errorf("Release(%s, %s): expected %v, got %v", r.key, r.token, r.want, err)
			}
		}()
	}
	wg.Wait()
	for i := range n {
		_, err := s.Inspect(ctx, fmt.Sprint("k", i))
		if held := err == nil; held != (i%3 != 0) {
			t.Errorf("k%d: expected held %v, got Inspect error %v", i, i%3 != 0, err)
		}
	}
}

// A batch of releases commits durably whatever its calls of the release
// function set: one that must commit durably (a fence ahead of the clock)
// turns synchronous_commit on, and a later one turned it off again.
func TestReleaseBatchCommitsDurably(t *testing.T) {
	_, dsn := fresh(t)
	s := open(t, dsn, pgstore.Options{})
	pool := testpg.Connect(t, dsn, pgxpool.New)
	ctx := ctx5(t)
	for _, k := range []string{"a", "b"} {
		if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: k, Token: "t", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var res []int32
	if err := tx.QueryRow(ctx, pgstore.ReleaseBatchSQL(s), []string{"a", "b", "c"}, []string{"t", "t", "t"}, s.Channel(), false).Scan(&res); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(res) != "[0 0 2]" {
		t.Errorf("expected results [0 0 2], got %v", res)
	}
	var sc string
	if err := tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc); err != nil {
		t.Fatal(err)
	}
	if sc != "on" {
		t.Errorf("expected synchronous_commit on after the batch, got %q", sc)
	}
}

// A bad row fails only the acquire of its own key, also when acquires of
// other keys went in the same statement: four acquires, sent one at a
// time, wait for their keys' advisory locks, held by another transaction, so
// that the next ones wait together for a slot.
func TestBadRowFailsOnlyItsOwnAcquire(t *testing.T) {
	_, dsn := fresh(t)
	s := open(t, dsn, pgstore.Options{})
	pool := testpg.Connect(t, dsn, pgxpool.New)
	ctx := ctx5(t)
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "bad", Token: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "UPDATE leasehold_locks SET fence = 0 WHERE key = 'bad'"); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	blocked := []string{"b0", "b1", "b2", "b3"}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext(k)) FROM unnest($2::text[]) AS k", pgstore.LockClass(s), blocked); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	acquire := func(key string, bad bool) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "b", TTL: time.Minute, QueueTTL: time.Minute})
			switch {
			case bad && !errors.Is(err, leasehold.ErrBadEntry):
				t.Errorf("Acquire(%s): expected ErrBadEntry, got %v", key, err)
			case !bad && err != nil:
				t.Errorf("Acquire(%s): expected nil, got %v", key, err)
			}
		}()
	}
	// One at a time: each takes a slot alone once the one before waits.
	for i, k := range blocked {
		acquire(k, false)
		for waiting := 0; waiting <= i; time.Sleep(time.Millisecond) {
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' AND datname = current_database()").Scan(&waiting); err != nil {
				t.Fatal(err)
			}
		}
	}
	acquire("bad", true)
	for i := range 20 {
		acquire(fmt.Sprint("k", i), false)
	}
	time.Sleep(100 * time.Millisecond) // they wait for a slot
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}
