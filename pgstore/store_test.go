package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

// fresh starts a server and returns it with the DSN of a new database.
func fresh(t *testing.T) (*testpg.Server, string) {
	t.Helper()
	srv := testpg.Start(t)
	return srv, srv.CreateDatabase(t)
}

func ctx5(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Expiry is decided by the row's expires_at against the database clock: the
// client sends only a TTL. Moving expires_at on the server (as the database
// clock running ahead or behind would) is all that counts.
func TestExpiryUsesDatabaseClock(t *testing.T) {
	_, dsn := fresh(t)
	s := open(t, dsn, pgstore.Options{})
	db := testpg.Connect(t, dsn, pgxpool.New)
	ctx := ctx5(t)

	f1, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// expires_at - acquired_at is the TTL by the server's clock.
	var span time.Duration
	if err := db.QueryRow(ctx, "SELECT expires_at - acquired_at FROM leasehold_locks WHERE key = 'k'").Scan(&span); err != nil {
		t.Fatal(err)
	}
	if span < 10*time.Second || span > 10*time.Second+50*time.Millisecond {
		t.Fatalf("expected expires_at - acquired_at = 10s, got %v", span)
	}
	// The database says the lock expired (its clock ran past expires_at):
	// another token takes it at once, though the client's 10 s have not passed.
	if _, err := db.Exec(ctx, "UPDATE leasehold_locks SET expires_at = clock_timestamp() - interval '1 millisecond' WHERE key = 'k'"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Inspect(ctx, "k"); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("Inspect of a row expired by the database clock: expected ErrNotHeld, got %v", err)
	}
	if err := s.Renew(ctx, "k", "a", time.Minute); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("Renew of a row expired by the database clock: expected ErrNotOwned, got %v", err)
	}
	f2, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "b", TTL: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("Acquire after the database expired the row: %v", err)
	}
	if f2.Fence <= f1.Fence {
		t.Fatalf("expected fence > %d, got %d", f1.Fence, f2.Fence)
	}
	// The database says the lock lives for another hour: the 50 ms the
	// client asked for are irrelevant.
	if _, err := db.Exec(ctx, "UPDATE leasehold_locks SET expires_at = clock_timestamp() + interval '1 hour' WHERE key = 'k'"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	g, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "c", TTL: time.Minute})
	if !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired while the database says held, got %v", err)
	}
	if g.Remaining < 59*time.Minute || g.Remaining > time.Hour {
		t.Fatalf("expected the holder's remaining TTL by the database (~1h), got %v", g.Remaining)
	}
}

// A same-token retry (after a lost reply) keeps the fence and the
// acquisition time, also when the row expired and nobody took it; it never
// creates a second row.
func TestSameTokenRetryKeepsFence(t *testing.T) {
	_, dsn := fresh(t)
	s := open(t, dsn, pgstore.Options{})
	db := testpg.Connect(t, dsn, pgxpool.New)
	ctx := ctx5(t)
	first, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "tok", TTL: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var acquired time.Time
	if err := db.QueryRow(ctx, "SELECT acquired_at FROM leasehold_locks WHERE key = 'k'").Scan(&acquired); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		g, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "tok", TTL: time.Minute})
		if err != nil || g.Fence != first.Fence {
			t.Fatalf("retry %d: expected fence %d, got %d, %v", i, first.Fence, g.Fence, err)
		}
	}
	time.Sleep(100 * time.Millisecond) // expired, not taken over
	if g, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "tok", TTL: 30 * time.Millisecond}); err != nil || g.Fence != first.Fence {
		t.Fatalf("retry after expiry: expected fence %d, got %d, %v", first.Fence, g.Fence, err)
	}
	var (
		n     int
		again time.Time
	)
	if err := db.QueryRow(ctx, "SELECT count(*), max(acquired_at) FROM leasehold_locks").Scan(&n, &again); err != nil {
		t.Fatal(err)
	}
	if n != 1 || !again.Equal(acquired) {
		t.Fatalf("expected one row acquired at %v, got %d rows acquired at %v", acquired, n, again)
	}
	// Another token after expiry gets a new, larger fence.
	time.Sleep(60 * time.Millisecond)
	if g, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "other", TTL: time.Minute}); err != nil || g.Fence <= first.Fence {
		t.Fatalf("another token after expiry: expected fence > %d, got %d, %v", first.Fence, g.Fence, err)
	}
}

// Fences come from the row and the floor counter, floored by the database clock: they keep
// increasing across release, expiry, stores sharing the table, the loss of
// every row (TRUNCATE) and the loss of the floor counter.
func TestFencesIncreaseAcrossReleaseExpiryAndDataLoss(t *testing.T) {
	_, dsn := fresh(t)
	s1 := open(t, dsn, pgstore.Options{})
	s2 := open(t, dsn, pgstore.Options{})
	db := testpg.Connect(t, dsn, pgxpool.New)
	ctx := ctx5(t)
	var last uint64
	step := func(what string, s *pgstore.Store, tok string, ttl time.Duration) {
		t.Helper()
		var g driver.Grant
		var err error
		for range 100 { // an expiring lock may still be there
			if g, err = s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: tok, TTL: ttl}); !errors.Is(err, leasehold.ErrNotAcquired) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if g.Fence <= last {
			t.Fatalf("%s: expected fence > %d, got %d", what, last, g.Fence)
		}
		last = g.Fence
	}
	step("first", s1, "a", time.Minute)
	if err := s1.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	step("after release, other store", s2, "b", 30*time.Millisecond)
	step("after expiry", s1, "c", time.Minute)
	if _, err := db.Exec(ctx, "TRUNCATE leasehold_locks"); err != nil {
		t.Fatal(err)
	}
	step("after TRUNCATE", s2, "d", time.Minute)
	if _, err := s1.ForceRelease(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	step("after ForceRelease", s1, "e", time.Minute)
	// The floor counter lost (a restore, a promoted standby that lagged):
	// the clock floor keeps fences rising.
	if _, err := s1.ForceRelease(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, "UPDATE leasehold_locks_counter SET v = 0"); err != nil {
		t.Fatal(err)
	}
	step("after the floor counter was reset", s2, "f", time.Minute)
}

// A Locker waiting on one store is woken by a release through another store
// over the same table (as in another process), well before its wait cap;
// and again after its LISTEN connection was killed and re-opened.
func TestNotificationWakesLockerAcrossStores(t *testing.T) {
	srv, dsn := fresh(t)
	holder := open(t, dsn, pgstore.Options{})
	waiter := open(t, dsn, pgstore.Options{ReconnectDelay: 100 * time.Millisecond})
	hl, err := leasehold.New(holder, leasehold.Options{Name: "holder", TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Close()
	wl, err := leasehold.New(waiter, leasehold.Options{Name: "waiter", TTL: 30 * time.Second, WaitCap: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer wl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()

	handOff := func(round string) {
		t.Helper()
		l, err := hl.TryAcquire(ctx, "job")
		if err != nil {
			t.Fatalf("%s: TryAcquire: %v", round, err)
		}
		type res struct {
			l   *leasehold.Lease
			err error
			at  time.Time
		}
		got := make(chan res, 1)
		go func() {
			l, err := wl.Acquire(ctx, "job")
			got <- res{l, err, time.Now()}
		}()
		time.Sleep(300 * time.Millisecond) // the waiter subscribes and blocks
		released := time.Now()
		if err := l.Release(ctx); err != nil {
			t.Fatalf("%s: Release: %v", round, err)
		}
		r := <-got
		if r.err != nil {
			t.Fatalf("%s: waiting Acquire: %v", round, r.err)
		}
		if d := r.at.Sub(released); d > 3*time.Second {
			t.Fatalf("%s: the waiter woke %v after the release; expected a notification within 3s (wait cap 1m, TTL 30s)", round, d)
		}
		if err := r.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	handOff("first")

	// Kill every LISTEN backend; the waiter's store re-opens its own.
	listeners := func() []int32 {
		var pids []int32
		rows, err := testpg.Connect(t, srv.DSN(), pgxpool.New).Query(ctx, "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN %'")
		if err != nil {
			t.Fatal(err)
		}
		pids, err = pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			t.Fatal(err)
		}
		return pids
	}
	old := listeners()
	if len(old) == 0 {
		t.Fatal("expected a LISTEN backend")
	}
	terminate(t, srv, "query LIKE 'LISTEN %'")
	deadline := time.Now().Add(10 * time.Second)
	for {
		now := listeners()
		if len(now) > 0 && !overlap(now, old) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new LISTEN backend 10s after killing %v (now %v)", old, now)
		}
		time.Sleep(50 * time.Millisecond)
	}
	handOff("after reconnect")
}

func overlap(a, b []int32) bool {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return true
			}
		}
	}
	return false
}

// Hostile table, schema and channel names are refused before anything
// runs: names must match a strict pattern, quoting is not relied on.
func TestHostileNames(t *testing.T) {
	_, dsn := fresh(t)
	db := testpg.Connect(t, dsn, pgxpool.New)
	ctx := ctx5(t)
	if _, err := db.Exec(ctx, `CREATE TABLE victim (x int); CREATE SCHEMA "We ird"`); err != nil {
		t.Fatal(err)
	}
	for _, opts := range []pgstore.Options{
		{Schema: "We ird"},
		{Table: `locks"; DROP TABLE victim; --`},
		{Channel: `ch'); DROP TABLE victim; --`},
		{Table: "t$fn$"},
	} {
		if _, err := pgstore.Open(ctx, dsn, opts); !errors.Is(err, leasehold.ErrInvalidOptions) {
			t.Errorf("Open(%+v): expected ErrInvalidOptions, got %v", opts, err)
		}
	}
	if _, err := db.Exec(ctx, "SELECT x FROM victim"); err != nil {
		t.Fatalf("the victim table is gone: %v", err)
	}
}

func TestOptionsRejected(t *testing.T) {
	long := strings.Repeat("x", 64)
	for _, opts := range []pgstore.Options{
		{Table: long},
		{Schema: long},
		{Table: strings.Repeat("x", 60)}, // the derived names would be too long
		{Table: "a\x00b"},
		{Table: "t$fn$; DROP TABLE x; --"},
		{Table: "Locks"},
		{Schema: "a b"},
		{Channel: "c'h"},
		{Migrate: 7},
		{ReconnectDelay: -time.Second},
	} {
		if _, err := pgstore.Open(t.Context(), "postgres://127.0.0.1:1/x", opts); !errors.Is(err, leasehold.ErrInvalidOptions) {
			t.Errorf("Open(%+v): expected ErrInvalidOptions, got %v", opts, err)
		}
	}
	if _, err := pgstore.New(t.Context(), nil, pgstore.Options{}); !errors.Is(err, leasehold.ErrInvalidOptions) {
		t.Errorf("New(nil): expected ErrInvalidOptions, got %v", err)
	}
	if _, err := pgstore.Open(t.Context(), "postgres://127.0.0.1:1/x?sslmode=bogus", pgstore.Options{}); !errors.Is(err, leasehold.ErrInvalidOptions) {
		t.Errorf("bad DSN: expected ErrInvalidOptions, got %v", err)
	}
}

// A role with only DML rights on the tables (and EXECUTE on the functions, which PUBLIC has) runs
// the store when the table was created beforehand (MigrateNever); with the
// default it gets an error that says what to do.
func TestLeastPrivilegeUser(t *testing.T) {
	srv, dsn := fresh(t)
	admin := testpg.Connect(t, dsn, pgxpool.New)
	ctx := ctx5(t)
	sql := pgstore.MigrationSQL(pgstore.Options{}) + `
CREATE ROLE leasehold_app LOGIN;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON leasehold_locks, leasehold_locks_waiters, leasehold_locks_presence TO leasehold_app;
GRANT SELECT, UPDATE ON leasehold_locks_counter TO leasehold_app;`
	if _, err := admin.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
	appDSN := strings.Replace(dsn, "postgres://postgres@", "postgres://leasehold_app@", 1)
	if _, err := pgstore.Open(ctx, appDSN, pgstore.Options{}); err == nil || !strings.Contains(err.Error(), "MigrateNever") {
		t.Fatalf("Open with migration as a user without CREATE: expected an error naming MigrateNever, got %v", err)
	}
	s := open(t, appDSN, pgstore.Options{Migrate: pgstore.MigrateNever})
	ch, stop, err := s.WaitRelease(ctx, "k", "w")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	drainAtOnce(ch)
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := s.Renew(ctx, "k", "t", time.Minute); err != nil {
		t.Fatal(err)
	}
	if ls, err := s.List(ctx, ""); err != nil || len(ls) != 1 {
		t.Fatalf("List: %v, %v", ls, err)
	}
	if err := s.Release(ctx, "k", "t"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(3 * time.Second):
		t.Fatal("no notification")
	}
	_ = srv
}

// Replicas starting together on an empty database all migrate without error.
func TestConcurrentMigrate(t *testing.T) {
	_, dsn := fresh(t)
	pool := testpg.Connect(t, dsn, pgxpool.New)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := pgstore.New(t.Context(), pool, pgstore.Options{Migrate: pgstore.MigrateCreate})
			if err != nil {
				errs <- err
				return
			}
			_ = s.Close()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent migrate: %v", err)
	}
}

// New over a caller's pool does no DDL by default and leaves the pool open
// on Close.
func TestNewDoesNotOwnPool(t *testing.T) {
	_, dsn := fresh(t)
	pool := testpg.Connect(t, dsn, pgxpool.New)
	ctx := ctx5(t)
	s, err := pgstore.New(ctx, pool, pgstore.Options{Table: "mine"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Second}); err == nil || errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("expected a store error (no table: New does not migrate), got %v", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("Close closed the caller's pool: %v", err)
	}
	if _, _, err := s.WaitRelease(ctx, "k", "w"); !errors.Is(err, pgstore.ErrClosed) {
		t.Fatalf("WaitRelease after Close: expected ErrClosed, got %v", err)
	}
}

// Without a way to open a LISTEN connection, WaitRelease says so; the
// Locker then waits for TTLs.
func TestNoListener(t *testing.T) {
	_, dsn := fresh(t)
	pool := testpg.Connect(t, dsn, pgxpool.New)
	s, err := pgstore.New(t.Context(), onlyDB{pool}, pgstore.Options{Migrate: pgstore.MigrateCreate})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, _, err := s.WaitRelease(t.Context(), "k", "w"); !errors.Is(err, pgstore.ErrNoListener) {
		t.Fatalf("expected ErrNoListener, got %v", err)
	}
}

// onlyDB hides the pool's Config method.
type onlyDB struct{ pgstore.DB }

var _ pgstore.DB = (*pgxpool.Pool)(nil)

// The server stops for good: every operation fails with a store error (not
// contention), and Close returns promptly while the listener is retrying.
func TestServerStopped(t *testing.T) {
	srv, dsn := fresh(t)
	s := open(t, dsn, pgstore.Options{ReconnectDelay: 50 * time.Millisecond})
	ctx := ctx5(t)
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	_, stop, err := s.WaitRelease(ctx, "k", "w")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	srv.Stop()
	contention := func(err error) bool {
		return errors.Is(err, leasehold.ErrNotAcquired) || errors.Is(err, leasehold.ErrNotOwned) || errors.Is(err, leasehold.ErrNotHeld)
	}
	for name, op := range map[string]func() error{
		"acquire": func() error {
			_, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "x", TTL: time.Minute})
			return err
		},
		"renew":   func() error { return s.Renew(ctx, "k", "t", time.Minute) },
		"release": func() error { return s.Release(ctx, "k", "t") },
		"inspect": func() error { _, err := s.Inspect(ctx, "k"); return err },
		"list":    func() error { _, err := s.List(ctx, ""); return err },
		"force":   func() error { _, err := s.ForceRelease(ctx, "k"); return err },
	} {
		if err := op(); err == nil || contention(err) {
			t.Errorf("%s on a stopped server: expected a store error, got %v", name, err)
		}
	}
	time.Sleep(200 * time.Millisecond) // the listener is reconnecting
	start := time.Now()
	_ = s.Close()
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Close took %v with the server down", d)
	}
}

func ExampleMigrationSQL() {
	for _, line := range strings.Split(pgstore.MigrationSQL(pgstore.Options{}), "\n") {
		if strings.HasPrefix(line, "CREATE") {
			name, _, _ := strings.Cut(line, "(")
			fmt.Println(strings.TrimSuffix(name, " "))
		}
	}
	// Output:
	// CREATE UNLOGGED TABLE IF NOT EXISTS "public"."leasehold_locks"
	// CREATE UNLOGGED TABLE IF NOT EXISTS "public"."leasehold_locks_waiters"
	// CREATE UNLOGGED TABLE IF NOT EXISTS "public"."leasehold_locks_presence"
	// CREATE TABLE IF NOT EXISTS "public"."leasehold_locks_counter"
	// CREATE OR REPLACE FUNCTION "public"."leasehold_locks_acquire4"
	// CREATE OR REPLACE FUNCTION "public"."leasehold_locks_acquire3"
	// CREATE OR REPLACE FUNCTION "public"."leasehold_locks_acquire2"
	// CREATE OR REPLACE FUNCTION "public"."leasehold_locks_acquire"
	// CREATE OR REPLACE FUNCTION "public"."leasehold_locks_release3"
	// CREATE OR REPLACE FUNCTION "public"."leasehold_locks_release2"
	// CREATE OR REPLACE FUNCTION "public"."leasehold_locks_release"
	// CREATE OR REPLACE FUNCTION "public"."leasehold_locks_subscribe"
	// CREATE OR REPLACE FUNCTION "public"."leasehold_locks_force_release"
}

// The psql runbook in README.md runs as written and sees the lock.
func TestRunbookQueries(t *testing.T) {
	_, dsn := fresh(t)
	s := open(t, dsn, pgstore.Options{})
	ctx := ctx5(t)
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "```sql\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("README.md has no ```sql block")
	}
	g, err := s.Acquire(ctx, driver.AcquireRequest{Key: "scheduler:job:42", Token: "tok", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var (
		token string
		fence int64
	)
	first, _, _ := strings.Cut(block, ";")
	if err := conn.QueryRow(ctx, first).Scan(&token, &fence, new(time.Duration), new(time.Time), new(string)); err != nil || token != "tok" || uint64(fence) != g.Fence {
		t.Fatalf("runbook owner query: expected tok/%d, got %q/%d, %v", g.Fence, token, fence, err)
	}
	if _, err := conn.Exec(ctx, block); err != nil { // all of it, the break-glass delete included
		t.Fatalf("runbook: %v", err)
	}
	if _, err := s.Inspect(ctx, "scheduler:job:42"); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("after the runbook's break-glass delete: expected ErrNotHeld, got %v", err)
	}
}
