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
