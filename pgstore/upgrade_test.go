package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

// A rolling upgrade: a replica of a previous version (3b0bdef, or v0.1.0
// = dabc1c3, whose migrations testdata/migration-*.sql are, verbatim)
// starts after this version migrated, re-creating its own function bodies,
// and both work on the same keys through their own statements. Fences keep
// increasing whoever grants them, every call succeeds, and an old waiter
// the new fast release did not wake takes the key on its next acquire.
func TestRollingUpgrade(t *testing.T) {
	for _, v := range []struct{ commit, acquire, release string }{
		{"3b0bdef", "leasehold_locks_acquire2", "leasehold_locks_release"},
		{"dabc1c3", "leasehold_locks_acquire3", "leasehold_locks_release2"},
	} {
		t.Run(v.commit, func(t *testing.T) { rollingUpgrade(t, v.commit, v.acquire, v.release) })
	}
}

func rollingUpgrade(t *testing.T, commit, acquireFn, releaseFn string) {
	old, err := os.ReadFile("testdata/migration-" + commit + ".sql")
	if err != nil {
		t.Fatal(err)
	}
	srv := testpg.Start(t)
	dsn := srv.CreateDatabase(t)
	s := open(t, dsn, pgstore.Options{}) // this version migrates first
	db := testpg.Connect(t, dsn, pgxpool.New)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := db.Exec(ctx, string(old)); err != nil { // then an old replica starts
		t.Fatalf("the old migration over this version's objects: %v", err)
	}
	oldAcquire := func(tok string, queue time.Duration) (bool, uint64) {
		t.Helper()
		var won bool
		var fence int64
		var rem int64
		var holder string
		var ahead int32
		if err := db.QueryRow(ctx, `SELECT * FROM `+acquireFn+`($1, $2, 60000000, 'old', $3, false, 'public.leasehold_locks', '')`,
			"k", tok, queue.Microseconds()).Scan(&won, &fence, &rem, &holder, &ahead); err != nil {
			t.Fatalf("old acquire: %v", err)
		}
		return won, uint64(fence)
	}
	oldRelease := func(tok string) int32 {
		t.Helper()
		var res int32
		if err := db.QueryRow(ctx, `SELECT `+releaseFn+`('k', $1, 'public.leasehold_locks', false)`, tok).Scan(&res); err != nil {
			t.Fatalf("old release: %v", err)
		}
		return res
	}
	var last uint64
	check := func(who string, fence uint64) {
		t.Helper()
		if fence <= last {
			t.Fatalf("%s: fence %d not above the last grant's %d", who, fence, last)
		}
		last = fence
	}
	for i := range 3 {
		// New, twice (the second cycle runs the fast statements on the kept
		// row), then old on the row the new release kept free.
		for j := range 2 {
			tok := fmt.Sprintf("new%d-%d", i, j)
			g, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: tok, TTL: time.Minute})
			if err != nil {
				t.Fatalf("new acquire %s: %v", tok, err)
			}
			check("new "+tok, g.Fence)
			if err := s.Release(ctx, "k", tok); err != nil {
				t.Fatalf("new release %s: %v", tok, err)
			}
		}
		won, fence := oldAcquire(fmt.Sprint("old", i), 0)
		if !won {
			t.Fatal("old acquire of a free row: not won")
		}
		check("old", fence)
		if res := oldRelease(fmt.Sprint("old", i)); res != 0 {
			t.Fatalf("old release: %d", res)
		}
	}
	// An old waiter queues behind a new holder whose row the new release
	// keeps: the old acquire does not mark the row, so the release frees the
	// key without granting it; the waiter's next acquire takes it.
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if won, _ := oldAcquire("w", time.Minute); won {
		t.Fatal("old waiting acquire of a held key: won")
	}
	if err := s.Release(ctx, "k", "h"); err != nil {
		t.Fatal(err)
	}
	won, fence := oldAcquire("w", time.Minute)
	if !won {
		t.Fatal("old waiter after the release: not won")
	}
	check("old waiter", fence)
	if res := oldRelease("w"); res != 0 {
		t.Fatalf("old release: %d", res)
	}
	g, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "end", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	check("new after the old waiter", g.Fence)

	// A new replica's place kept by its presence outlives its queue TTL and
	// gets the key from a new release, whatever the old replica re-created.
	s2 := open(t, dsn, pgstore.Options{Migrate: pgstore.MigrateNever})
	if err := s2.KeepPresence(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	kw := driver.AcquireRequest{Key: "k", Token: "kw", TTL: time.Minute, QueueTTL: 100 * time.Millisecond, Kept: time.Minute}
	if _, err := s2.Acquire(ctx, kw); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("new kept waiter: expected ErrNotAcquired, got %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := s.Release(ctx, "k", "end"); err != nil {
		t.Fatal(err)
	}
	if info, err := s.Inspect(ctx, "k"); err != nil || info.Token != "kw" || info.Fence <= last {
		t.Fatalf("expected the key granted to the kept waiter past its queue TTL with a larger fence, got %+v, %v", info, err)
	}
}
