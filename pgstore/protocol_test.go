package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

// TestProtocol checks the store's protocol fixes (#12, #21) on one server,
// each subtest on its own database.
func TestProtocol(t *testing.T) {
	srv := testpg.Start(t)
	t.Run("NoBackwardFenceWhenBlockedAcquirerResumes", func(t *testing.T) { testBackwardFence(t, srv) })
	t.Run("ContentionUnderStrictIsolation", func(t *testing.T) { testStrictIsolation(t, srv) })
	t.Run("ListSkipsBadRows", func(t *testing.T) { testBadRows(t, srv) })
	t.Run("MigrateUpgradesOldTables", func(t *testing.T) { testMigrateOld(t, srv) })
	t.Run("Misconfigured", func(t *testing.T) { testMisconfigured(t, srv) })
	t.Run("NotifyOnlyWhenSomeoneWaits", func(t *testing.T) { testNotifyOnlyWhenWaited(t, srv) })
	t.Run("QueueAcrossStores", func(t *testing.T) { testQueue(t, srv) })
	t.Run("WaiterDeadlineWhileListenHangs", func(t *testing.T) { testListenHangs(t, srv) })
	t.Run("CommitDurability", func(t *testing.T) { testDurability(t, srv) })
	t.Run("LostRowsWithClockBehind", func(t *testing.T) { testLostRowsClockBehind(t, srv) })
	t.Run("ReleaseSeesQueueJoinedUnderRowLock", func(t *testing.T) { testReleaseSeesLateQueue(t, srv) })
	t.Run("FreeRowKeptAndSwept", func(t *testing.T) { testFreeRowKept(t, srv) })
	t.Run("FastPathCommitDurability", func(t *testing.T) { testFastPathDurability(t, srv) })
	t.Run("LosingAcquireDoesNotHoldUpRelease", func(t *testing.T) { testLosingAcquireLockOrder(t, srv) })
}

// An acquire whose fast UPDATE waited for the key's row and found it taken
// keeps the row locked (READ COMMITTED re-checks the newest version and the
// lock stays); the acquire function in the same statement then takes the
// key's advisory lock. Taken in that order, row then advisory lock, it
// deadlocked with an acquire function holding the advisory lock and
// reading the row, and the holder's release waited behind both: under
// contention, past its TTL (TestConformance/Torture/Clock found the key
// taken, ErrNotOwned). Step by step: session X grants the free row to h
// and keeps its transaction open; acquire A (another store: the full
// statement) waits for the row; session Y takes the key's advisory lock,
// as an acquire function would before it reads the row; X commits. h's
// release must not wait for Y.
func testLosingAcquireLockOrder(t *testing.T, srv *testpg.Server) {
	dsn := srv.CreateDatabase(t)
	s := open(t, dsn, pgstore.Options{})
	other := open(t, dsn, pgstore.Options{}) // knows no free key: sends the full acquire statement
	admin := testpg.Connect(t, srv.DSN(), pgxpool.New)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	// A free row (a released key's fence state).
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	xtx := sessionTx(t, ctx, dsn)
	var fence uint64
	if err := xtx.QueryRow(ctx, pgstore.AcquireFastSQL(s), "k", "h", int64(time.Minute/time.Microsecond), "holder-h", false).Scan(&fence); err != nil {
		t.Fatalf("X: the fast acquire of the free row: %v", err)
	}
	acquired := make(chan error, 1)
	go func() {
		_, err := other.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "c", TTL: time.Minute})
		acquired <- err
	}()
	// A itself, not another backend of the database (a sweep of the free
	// row would wait for X too): the combined statement, waiting for X's row.
	statementWaiting(t, admin, dbName(t, dsn), "WITH u AS (%")
	ytx := sessionTx(t, ctx, dsn)
	var yLocked bool
	if err := ytx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1, hashtext($2))", pgstore.LockClass(s), "k").Scan(&yLocked); err != nil {
		t.Fatal(err)
	}
	if err := xtx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	start := time.Now()
	go func() { released <- s.Release(ctx, "k", "h") }()
	select {
	case err := <-released:
		if err != nil {
			t.Errorf("h's release: expected success, got %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Errorf("h's release still waits after %v for acquire A, which lost the key (Y holds the key's advisory lock: %v)", time.Since(start), yLocked)
		if err := ytx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-released; err != nil {
			t.Errorf("h's release: expected success, got %v", err)
		}
	}
	_ = ytx.Rollback(ctx)
	// A lost the key to h, or (when its function read the row after h's
	// release, which the failed re-check of its UPDATE does not hold up)
	// took it after h: h's token-checked release succeeded, so A did not
	// hold the key before it.
	switch err := <-acquired; {
	case errors.Is(err, leasehold.ErrNotAcquired):
	case err == nil:
		info, err := s.Inspect(ctx, "k")
		if err != nil || info.Token != "c" || info.Fence <= fence {
			t.Errorf("A's acquire succeeded: expected the key held by c with a fence above h's %d, got %+v, %v", fence, info, err)
		}
	default:
		t.Errorf("A's acquire: expected ErrNotAcquired or success after h's release, got %v", err)
	}
}

// sessionTx opens a session of its own on dsn and begins a transaction
// there; both end with the test.
func sessionTx(t *testing.T, ctx context.Context, dsn string) pgx.Tx {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// The plain-statement fast paths of acquire and release commit as the
// functions do: without waiting for a flush unless Durable, durably when the
// fence is ahead of the clock.
func testFastPathDurability(t *testing.T, srv *testpg.Server) {
	dsn := srv.CreateDatabase(t)
	s := open(t, dsn, pgstore.Options{})
	ctx := ctx5(t)
	conn, err := pgx.Connect(ctx, dsn+"&synchronous_commit=on")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// setting runs sql in a transaction (committed when commit) and returns
	// synchronous_commit as the transaction would commit with, and the
	// statement's first column.
	setting := func(commit bool, sql string, args ...any) (string, any) {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		var first any
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			v, err := rows.Values()
			if err != nil {
				t.Fatal(err)
			}
			first = v[0]
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		var v string
		if err := tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&v); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return v, first
	}
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t0", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, "k", "t0"); err != nil { // the row stays, free
		t.Fatal(err)
	}
	acq := func(tok string, durable bool) []any {
		return []any{"k", tok, int64(60e6), "", int64(0), durable, "c", "", int64(0)}
	}
	for _, tc := range []struct {
		name   string
		commit bool
		sql    string
		args   []any
		want   string
	}{
		{"acquire, Durable", false, pgstore.AcquireSQL(s), acq("t1", true), "on"},
		{"fast acquire, Durable", false, pgstore.AcquireFastSQL(s), []any{"k", "t1", int64(60e6), "", true}, "on"},
		{"fast acquire", false, pgstore.AcquireFastSQL(s), []any{"k", "t1", int64(60e6), "", false}, "off"},
		{"acquire", true, pgstore.AcquireSQL(s), acq("t1", false), "off"},
		{"release, Durable", false, pgstore.ReleaseSQL(s), []any{"k", "t1", "c", true}, "on"},
		{"fast release, Durable", false, pgstore.ReleaseFastSQL(s) + " RETURNING 0", []any{"k", "t1", true}, "on"},
		{"fast release", false, pgstore.ReleaseFastSQL(s) + " RETURNING 0", []any{"k", "t1", false}, "off"},
		{"release", true, pgstore.ReleaseSQL(s), []any{"k", "t1", "c", false}, "off"},
	} {
		if got, first := setting(tc.commit, tc.sql, tc.args...); got != tc.want || first == nil || first == false {
			t.Errorf("%s: expected synchronous_commit %s and success, got %s and %v", tc.name, tc.want, got, first)
		}
	}
	if _, err := conn.Exec(ctx, "UPDATE leasehold_locks_counter SET v = v + 1000000000000 + (extract(epoch FROM clock_timestamp()) * 1000000)::bigint"); err != nil {
		t.Fatal(err)
	}
	if got, _ := setting(true, pgstore.AcquireSQL(s), acq("t2", false)...); got != "on" {
		t.Errorf("a grant ahead of the clock: expected a durable commit (synchronous_commit on), got %s", got)
	}
	var floor, fence int64
	if err := conn.QueryRow(ctx, "SELECT c.v, l.fence FROM leasehold_locks_counter c, leasehold_locks l WHERE l.key = 'k'").Scan(&floor, &fence); err != nil || floor != fence {
		t.Errorf("a grant ahead of the clock: expected the floor raised to its fence %d, got %d, %v", fence, floor, err)
	}
}

// A waiter that joins the queue while the holder's release waits for the
// row's lock (its acquire holds it) is seen by that release, which grants
// it the key: the release reads the queue after it got the row, never from
// a snapshot taken before it waited (that missed the entry, and the waiter
// slept until its next poll).
func testReleaseSeesLateQueue(t *testing.T, srv *testpg.Server) {
	// The row free of waiters (the plain-statement release, which then
	// finds it waited for) and marked as waited for (the release function).
	for _, waited := range []bool{false, true} {
		t.Run(fmt.Sprint("waited=", waited), func(t *testing.T) { testReleaseSeesLateQueueOn(t, srv, waited) })
	}
}

func testReleaseSeesLateQueueOn(t *testing.T, srv *testpg.Server, waited bool) {
	dsn := srv.CreateDatabase(t)
	s := open(t, dsn, pgstore.Options{})
	admin := testpg.Connect(t, srv.DSN(), pgxpool.New)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for i := range 2 { // the second cycle's acquire updates the kept row
		if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: fmt.Sprint("h", i), TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if err := s.Release(ctx, "k", "h0"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := testpg.Connect(t, dsn, pgxpool.New).Exec(ctx, "UPDATE leasehold_locks SET waited = $1", waited); err != nil {
		t.Fatal(err)
	}
	// The waiter's acquire, in a transaction left open: it holds the row's
	// lock and its queue entry is not committed yet.
	x := execAll(t, ctx, dsn, "BEGIN", `SELECT * FROM leasehold_locks_acquire3('k', 'w', 60000000, 'waiter', 60000000, false, 'c', '')`)
	done := make(chan error, 1)
	go func() { done <- s.Release(ctx, "k", "h1") }()
	backendWaiting(t, admin, dbName(t, dsn))
	x("COMMIT")
	if err := <-done; err != nil {
		t.Fatalf("Release: %v", err)
	}
	info, err := s.Inspect(ctx, "k")
	if err != nil || info.Token != "w" {
		t.Fatalf("after the release: expected the key granted to the waiter w, got %+v, %v", info, err)
	}
}

// An uncontended release keeps the key's row, free (empty token), with its
// fence; the next acquire updates it with a larger fence. A sweep deletes
// free rows a minute old whose fence is a minute below the clock, never a
// held or newer one.
func testFreeRowKept(t *testing.T, srv *testpg.Server) {
	dsn := srv.CreateDatabase(t)
	s := open(t, dsn, pgstore.Options{})
	db := testpg.Connect(t, dsn, pgxpool.New)
	ctx := ctx5(t)
	var last uint64
	for i := range 3 {
		tok := fmt.Sprint("t", i)
		g, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: tok, TTL: time.Minute})
		if err != nil || g.Fence <= last {
			t.Fatalf("cycle %d: expected a fence above %d, got %d, %v", i, last, g.Fence, err)
		}
		last = g.Fence
		if err := s.Release(ctx, "k", tok); err != nil {
			t.Fatal(err)
		}
		var token string
		var fence uint64
		var live bool
		if err := db.QueryRow(ctx, "SELECT token, fence, expires_at > clock_timestamp() FROM leasehold_locks WHERE key = 'k'").Scan(&token, &fence, &live); err != nil {
			t.Fatalf("cycle %d: the released key's row: %v", i, err)
		}
		if token != "" || fence != last || live {
			t.Fatalf("cycle %d: expected a free row with fence %d, got token %q fence %d live %v", i, last, token, fence, live)
		}
	}
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "held", Token: "h", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// Age the rows: k's release and fence two minutes back, held's
	// acquisition too (its expiry stays an hour ahead).
	if _, err := db.Exec(ctx, `UPDATE leasehold_locks SET expires_at = expires_at - interval '2 minutes', fence = fence - 120000000 WHERE key = 'k';
UPDATE leasehold_locks SET fence = fence - 120000000, acquired_at = acquired_at - interval '2 minutes' WHERE key = 'held'`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, pgstore.SweepSQL(s)); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(ctx, "SELECT key FROM leasehold_locks ORDER BY key")
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(keys) != 1 || keys[0] != "held" {
		t.Fatalf("after a sweep: expected only the held key's row, got %v, %v", keys, err)
	}
	g, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "again", TTL: time.Minute})
	if err != nil || g.Fence <= last {
		t.Fatalf("after the sweep deleted k's row: expected a fence above %d, got %d, %v", last, g.Fence, err)
	}
}

// The lock and waiter tables are UNLOGGED unless Options.Durable: a crash
// empties them. Fences stay unique even when the clock is behind them (a
// step back): a grant ahead of the clock raises the durable floor.
func testLostRowsClockBehind(t *testing.T, srv *testpg.Server) {
	ctx := ctx5(t)
	persistence := func(dsn string) string {
		var p string
		if err := testpg.Connect(t, dsn, pgxpool.New).QueryRow(ctx,
			"SELECT string_agg(relpersistence::text, ',' ORDER BY relname) FROM pg_class WHERE relname ~ '^leasehold_locks(_counter|_waiters)?$' AND relkind = 'r'").Scan(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	durable := srv.CreateDatabase(t)
	open(t, durable, pgstore.Options{Durable: true})
	if p := persistence(durable); p != "p,p,p" {
		t.Fatalf("Durable: expected three logged tables, got %s", p)
	}
	dsn := srv.CreateDatabase(t)
	s := open(t, dsn, pgstore.Options{})
	if p := persistence(dsn); p != "u,p,u" { // locks, counter, waiters
		t.Fatalf("default: expected UNLOGGED lock and waiter tables and a logged counter, got %s", p)
	}
	db := testpg.Connect(t, dsn, pgxpool.New)
	if _, err := db.Exec(ctx, "UPDATE leasehold_locks_counter SET v = (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + 1000000000000"); err != nil {
		t.Fatal(err)
	}
	var last uint64
	for i := range 3 {
		g, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: fmt.Sprint("t", i), TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if g.Fence <= last {
			t.Fatalf("grant %d after the lock rows were lost: expected fence > %d, got %d", i, last, g.Fence)
		}
		last = g.Fence
		// What a crash does to an UNLOGGED table.
		if _, err := db.Exec(ctx, "TRUNCATE leasehold_locks"); err != nil {
			t.Fatal(err)
		}
	}
}

// Acquire and release turn synchronous_commit off for their own transaction
// only when the clock floor covers their loss: not with Options.Durable,
// and not for a grant whose fence is ahead of the clock.
func testDurability(t *testing.T, srv *testpg.Server) {
	dsn := srv.CreateDatabase(t)
	open(t, dsn, pgstore.Options{}) // migrates
	ctx := ctx5(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// setting runs stmt in a transaction and returns synchronous_commit as
	// the transaction would commit with.
	setting := func(stmt string) string {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		if _, err := tx.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
		var v string
		if err := tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if _, err := conn.Exec(ctx, "SET synchronous_commit = on"); err != nil {
		t.Fatal(err)
	}
	acq := func(durable bool) string {
		return fmt.Sprintf("SELECT * FROM leasehold_locks_acquire('k', 't', 60000000, '', 0, %v, 'c')", durable)
	}
	rel := func(durable bool) string {
		return fmt.Sprintf("SELECT leasehold_locks_release('k', 't', 'c', %v)", durable)
	}
	for _, tc := range []struct {
		name, stmt, want string
	}{
		{"acquire", acq(false), "off"},
		{"acquire, Durable", acq(true), "on"},
	} {
		if got := setting(tc.stmt); got != tc.want {
			t.Errorf("%s: expected synchronous_commit %s, got %s", tc.name, tc.want, got)
		}
	}
	if _, err := conn.Exec(ctx, acq(false)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, stmt, want string
	}{
		{"release", rel(false), "off"},
		{"release, Durable", rel(true), "on"},
	} {
		if got := setting(tc.stmt); got != tc.want {
			t.Errorf("%s: expected synchronous_commit %s, got %s", tc.name, tc.want, got)
		}
	}
	if _, err := conn.Exec(ctx, rel(false)+"; UPDATE leasehold_locks_counter SET v = v + 1000000000000 + "+
		"(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"); err != nil {
		t.Fatal(err)
	}
	if got := setting(acq(false)); got != "on" {
		t.Errorf("a grant ahead of the clock: expected a durable commit (synchronous_commit on), got %s", got)
	}
}

// backendWaiting returns the pid of the backend of database db that waits
// on a lock, polling until one does.
func backendWaiting(t *testing.T, admin *pgxpool.Pool, db string) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		var pid int
		err := admin.QueryRow(t.Context(), `SELECT pid FROM pg_stat_activity
WHERE datname = $1 AND wait_event_type = 'Lock' AND pid <> pg_backend_pid() LIMIT 1`, db).Scan(&pid)
		if err == nil {
			return pid
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no backend waiting on a lock")
	return 0
}

// statementWaiting polls until a backend of db running a statement LIKE
// pattern waits for another transaction (a row it wants is locked).
func statementWaiting(t *testing.T, admin *pgxpool.Pool, db, pattern string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var n int
		err := admin.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
WHERE datname = $1 AND wait_event_type = 'Lock' AND wait_event IN ('transactionid', 'tuple') AND query LIKE $2`, db, pattern).Scan(&n)
		if err == nil && n > 0 {
			return
		}
	}
	t.Fatalf("no statement LIKE %q waiting for a row lock", pattern)
}

type grantAt struct {
	fence uint64
	err   error
	at    time.Time
}

// The reproduction of #12 item 1, step by step: a session inserts the key's
// row and keeps its transaction open; acquirer A blocks behind it; A's
// backend is stopped (SIGSTOP); the session commits and deletes the row; B
// acquires and releases; A's backend continues. Whatever the order the
// store lets them in, the later grant has the higher fence.
func testBackwardFence(t *testing.T, srv *testpg.Server) {
	dsn := srv.CreateDatabase(t)
	s := open(t, dsn, pgstore.Options{})
	admin := testpg.Connect(t, srv.DSN(), pgxpool.New)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	x := execAll(t, ctx, dsn, "BEGIN", `INSERT INTO leasehold_locks (key, token, fence, expires_at, acquired_at)
VALUES ('k', 'x', 1, clock_timestamp() + interval '1 hour', clock_timestamp())`)
	aDone := make(chan grantAt, 1)
	go func() {
		g, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "A", TTL: time.Minute})
		aDone <- grantAt{g.Fence, err, time.Now()}
	}()
	pid := backendWaiting(t, admin, dbName(t, dsn))
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP backend %d: %v", pid, err)
	}
	stopped := true
	cont := func() {
		if stopped {
			stopped = false
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer cont()
	x("COMMIT", "DELETE FROM leasehold_locks WHERE key = 'k'")
	bDone := make(chan grantAt, 1)
	go func() {
		g, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "B", TTL: time.Minute})
		if err == nil {
			err = s.Release(ctx, "k", "B")
		}
		bDone <- grantAt{g.Fence, err, time.Now()}
	}()
	var b grantAt
	select {
	case b = <-bDone: // the store let B in while A was stopped
	case <-time.After(500 * time.Millisecond): // B waits behind A
	}
	cont()
	a := <-aDone
	if b.at.IsZero() {
		b = <-bDone
	}
	t.Logf("A: fence %d, %v; B: fence %d, %v", a.fence, a.err, b.fence, b.err)
	checkGrantOrder(t, a, b)
}

// execAll opens a session on dsn, runs stmts on it, and returns a function
// that runs more.
func execAll(t *testing.T, ctx context.Context, dsn string, stmts ...string) func(stmts ...string) {
	t.Helper()
	x, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close(context.Background()) })
	run := func(stmts ...string) {
		t.Helper()
		for _, st := range stmts {
			if _, err := x.Exec(ctx, st); err != nil {
				t.Fatalf("%s: %v", st, err)
			}
		}
	}
	run(stmts...)
	return run
}

// checkGrantOrder fails unless a and b are grants or contention and, when
// both were granted, the later grant has the higher fence.
func checkGrantOrder(t *testing.T, a, b grantAt) {
	t.Helper()
	if a.err != nil && !errors.Is(a.err, leasehold.ErrNotAcquired) || b.err != nil && !errors.Is(b.err, leasehold.ErrNotAcquired) {
		t.Fatalf("expected grants or ErrNotAcquired, got A: %v, B: %v", a.err, b.err)
	}
	if a.err != nil || b.err != nil {
		return
	}
	first, second := a, b
	if b.at.Before(a.at) {
		first, second = b, a
	}
	if second.fence <= first.fence {
		t.Fatalf("the later grant has fence %d, not above the earlier grant's %d", second.fence, first.fence)
	}
}

// #12 item 3: with default_transaction_isolation REPEATABLE READ or
// SERIALIZABLE, racing for expired rows is contention, never a store error.
func testStrictIsolation(t *testing.T, srv *testpg.Server) {
	for _, iso := range []string{"repeatable read", "serializable"} {
		t.Run(strings.ReplaceAll(iso, " ", "_"), func(t *testing.T) {
			dsn := srv.CreateDatabase(t)
			admin := testpg.Connect(t, srv.DSN(), pgxpool.New)
			if _, err := admin.Exec(t.Context(), fmt.Sprintf("ALTER DATABASE %s SET default_transaction_isolation = '%s'",
				pgx.Identifier{dbName(t, dsn)}.Sanitize(), iso)); err != nil {
				t.Fatal(err)
			}
			pool := testpg.Connect(t, dsn, pgxpool.New) // the user's pool: the database default applies
			var got string
			if err := pool.QueryRow(t.Context(), "SHOW transaction_isolation").Scan(&got); err != nil || got != iso {
				t.Fatalf("expected isolation %s, got %q, %v", iso, got, err)
			}
			s, err := pgstore.New(t.Context(), pool, pgstore.Options{Migrate: pgstore.MigrateCreate})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			var (
				wg    sync.WaitGroup
				mu    sync.Mutex
				fails []error
				wins  int
			)
			stop := time.Now().Add(time.Second)
			for i := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := 0; time.Now().Before(stop); j++ {
						key := fmt.Sprintf("k%d", j%2)
						tok := fmt.Sprintf("g%d-%d", i, j)
						// A 1 ms TTL: most tries race for an expired row.
						_, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: tok, TTL: time.Millisecond})
						if err == nil {
							err = s.Release(ctx, key, tok)
							if errors.Is(err, leasehold.ErrNotHeld) { // it expired
								err = nil
							}
							mu.Lock()
							wins++
							mu.Unlock()
						}
						if err != nil && !errors.Is(err, leasehold.ErrNotAcquired) && !errors.Is(err, leasehold.ErrNotOwned) {
							mu.Lock()
							fails = append(fails, err)
							mu.Unlock()
							return
						}
					}
				}()
			}
			wg.Wait()
			t.Logf("%d grants", wins)
			for i, err := range fails {
				if i < 5 {
					t.Errorf("under %s: expected success or contention, got %v", iso, err)
				}
			}
		})
	}
}

// #12 item 9: a row with an infinite expiry (or a fence <= 0) is skipped by
// List and reported with ErrBadEntry, beside the good rows; Acquire of that
// key says ErrBadEntry; ForceRelease removes it.
func testBadRows(t *testing.T, srv *testpg.Server) {
	dsn := srv.CreateDatabase(t)
	s := open(t, dsn, pgstore.Options{})
	db := testpg.Connect(t, dsn, pgxpool.New)
	ctx := ctx5(t)
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "good", Token: "t", TTL: time.Minute, Holder: "me"}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO leasehold_locks (key, token, fence, expires_at, acquired_at) VALUES
('bad:inf', 'x', 5, 'infinity', clock_timestamp()), ('bad:fence', 'y', -1, clock_timestamp() + interval '1 hour', clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	ls, err := s.List(ctx, "")
	if !errors.Is(err, leasehold.ErrBadEntry) || !strings.Contains(err.Error(), "bad:inf") || !strings.Contains(err.Error(), "bad:fence") {
		t.Fatalf("List: expected ErrBadEntry naming both bad keys, got %v", err)
	}
	if len(ls) != 1 || ls[0].Key != "good" || ls[0].Holder != "me" {
		t.Fatalf("List: expected the good lock beside the error, got %+v", ls)
	}
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "bad:inf", Token: "t", TTL: time.Minute}); !errors.Is(err, leasehold.ErrBadEntry) {
		t.Fatalf("Acquire of a bad row: expected ErrBadEntry, got %v", err)
	}
	if _, err := s.ForceRelease(ctx, "bad:inf"); err != nil && !errors.Is(err, leasehold.ErrBadEntry) {
		t.Fatalf("ForceRelease of a bad row: %v", err)
	}
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "bad:inf", Token: "t", TTL: time.Minute}); err != nil {
		t.Fatalf("Acquire after ForceRelease of the bad row: %v", err)
	}
}

// Tables of the previous version (token NOT NULL, no holder, a fence
// sequence) are upgraded in place: locks held survive, fences continue above
// the old sequence, and migrating again changes nothing.
func testMigrateOld(t *testing.T, srv *testpg.Server) {
	dsn := srv.CreateDatabase(t)
	db := testpg.Connect(t, dsn, pgxpool.New)
	ctx := ctx5(t)
	const ahead = int64(1) << 60
	if _, err := db.Exec(ctx, fmt.Sprintf(`CREATE TABLE leasehold_locks (
	key text COLLATE "C" PRIMARY KEY, token text NOT NULL, fence bigint NOT NULL,
	expires_at timestamptz NOT NULL, acquired_at timestamptz NOT NULL);
CREATE SEQUENCE leasehold_locks_fence AS bigint MINVALUE 1 NO CYCLE;
SELECT setval('leasehold_locks_fence', %d);
INSERT INTO leasehold_locks VALUES ('held', 'old', %d, clock_timestamp() + interval '1 hour', clock_timestamp());`, ahead, ahead)); err != nil {
		t.Fatal(err)
	}
	s := open(t, dsn, pgstore.Options{})
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if info, err := s.Inspect(ctx, "held"); err != nil || info.Token != "old" || info.Fence != uint64(ahead) {
		t.Fatalf("the old lock: expected token old fence %d, got %+v, %v", ahead, info, err)
	}
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "held", Token: "new", TTL: time.Minute}); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("the old lock is still held: expected ErrNotAcquired, got %v", err)
	}
	g, err := s.Acquire(ctx, driver.AcquireRequest{Key: "other", Token: "new", TTL: time.Minute})
	if err != nil || g.Fence <= uint64(ahead) {
		t.Fatalf("a new key after the upgrade: expected a fence above the old sequence %d, got %d, %v", ahead, g.Fence, err)
	}
}

// Missing objects and missing privileges are configuration errors.
func testMisconfigured(t *testing.T, srv *testpg.Server) {
	dsn := srv.CreateDatabase(t)
	ctx := ctx5(t)
	s := open(t, dsn, pgstore.Options{Migrate: pgstore.MigrateNever}) // nothing created
	_, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Minute})
	if !errors.Is(err, leasehold.ErrMisconfigured) {
		t.Fatalf("Acquire without the store's objects: expected ErrMisconfigured, got %v", err)
	}
	admin := testpg.Connect(t, dsn, pgxpool.New)
	if _, err := admin.Exec(ctx, pgstore.MigrationSQL(pgstore.Options{})+`
CREATE ROLE leasehold_nobody LOGIN;`); err != nil {
		t.Fatal(err)
	}
	nobody := open(t, strings.Replace(dsn, "postgres://postgres@", "postgres://leasehold_nobody@", 1), pgstore.Options{Migrate: pgstore.MigrateNever})
	_, err = nobody.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Minute})
	if !errors.Is(err, leasehold.ErrMisconfigured) {
		t.Fatalf("Acquire without privileges: expected ErrMisconfigured, got %v", err)
	}
}

// listen opens a raw LISTEN on the store's channel and returns the payloads
// it receives until the test ends.
func listen(t *testing.T, dsn, channel string) <-chan string {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	out := make(chan string, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			out <- n.Payload
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = conn.Close(context.Background())
	})
	return out
}

// #21 item 2: releases nobody waits for send no NOTIFY (which would take the
// cluster-wide notify lock at commit); a release with a queued waiter sends
// one, naming the head, on the head's store's own channel only.
func testNotifyOnlyWhenWaited(t *testing.T, srv *testpg.Server) {
	dsn := srv.CreateDatabase(t)
	s := open(t, dsn, pgstore.Options{})
	ctx := ctx5(t)
	got := listen(t, dsn, s.Channel())
	for i := range 20 {
		tok := fmt.Sprint("t", i)
		if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: tok, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, "k", tok); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case p := <-got:
		t.Fatalf("an uncontended release sent a notification %q", p)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "w1", TTL: time.Minute, QueueTTL: time.Minute}); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatal(err)
	}
	own := listen(t, dsn, s.WakeChannel())
	if err := s.Release(ctx, "k", "holder"); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		t.Fatalf("a grant to a queued waiter with its own channel was also sent on the shared channel: %q", p)
	case <-time.After(300 * time.Millisecond):
	}
	select {
	case p := <-own:
		// The release granted the key to the head: "g", its token's
		// length, ":", the token, the fence, ":", its TTL in ms, ":", the key.
		if !strings.HasPrefix(p, "g2:w1") || !strings.HasSuffix(p, ":60000:k") {
			t.Fatalf("expected a grant naming the head w1 of k, got %q", p)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("a release with a queued waiter sent no notification")
	}
}

// drainAtOnce takes the wake-up WaitRelease put on ch at once, if any.
func drainAtOnce(ch <-chan driver.Wake) {
	select {
	case <-ch:
	default:
	}
}

func wokeWithin(ch <-chan driver.Wake, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// queueFixture is a holder and two waiters, each on its own store (as
// separate processes), and an observer.
type queueFixture struct {
	t              *testing.T
	ctx            context.Context
	h, s1, s2, obs *pgstore.Store
	w1, w2         <-chan driver.Wake
}

func (f *queueFixture) req(tok string, q time.Duration) driver.AcquireRequest {
	return driver.AcquireRequest{Key: "k", Token: tok, TTL: time.Minute, Holder: "host-" + tok, QueueTTL: q}
}

func (f *queueFixture) subscribe(s *pgstore.Store, tok string) <-chan driver.Wake {
	f.t.Helper()
	ch, stop, err := s.WaitRelease(f.ctx, "k", tok)
	if err != nil {
		f.t.Fatal(err)
	}
	drainAtOnce(ch)
	f.t.Cleanup(stop)
	return ch
}

// inspect checks the observer's view of k.
func (f *queueFixture) inspect(holder string, waiting int, next string) {
	f.t.Helper()
	info, err := f.obs.Inspect(f.ctx, "k")
	if err != nil || info.Holder != holder || info.Waiting != waiting || info.NextHolder != next {
		f.t.Fatalf("Inspect: expected holder %s, %d waiting, next %q; got %+v, %v", holder, waiting, next, info, err)
	}
}

// The queue spans stores (processes): FIFO, a newcomer never overtakes a
// live waiter, a release wakes only the head, a departing head wakes the
// next one, holders and queue lengths are reported.
func testQueue(t *testing.T, srv *testpg.Server) {
	dsn := srv.CreateDatabase(t)
	f := &queueFixture{t: t, ctx: ctx5(t)}
	f.h, f.s1, f.s2, f.obs = open(t, dsn, pgstore.Options{}), open(t, dsn, pgstore.Options{}), open(t, dsn, pgstore.Options{}), open(t, dsn, pgstore.Options{})
	if _, err := f.h.Acquire(f.ctx, f.req("h", 0)); err != nil {
		t.Fatal(err)
	}
	f.w1, f.w2 = f.subscribe(f.s1, "w1"), f.subscribe(f.s2, "w2")
	for i, tok := range []string{"w1", "w2"} {
		g, err := []*pgstore.Store{f.s1, f.s2}[i].Acquire(f.ctx, f.req(tok, time.Minute))
		if !errors.Is(err, leasehold.ErrNotAcquired) || g.Holder != "host-h" || g.Ahead != i || g.Remaining <= 0 {
			t.Fatalf("%s queues: expected ErrNotAcquired, holder host-h, %d ahead, a TTL; got %+v, %v", tok, i, g, err)
		}
	}
	f.inspect("host-h", 2, "host-w1")
	if err := f.h.Release(f.ctx, "k", "h"); err != nil {
		t.Fatal(err)
	}
	if !wokeWithin(f.w1, 3*time.Second) {
		t.Fatal("the head w1 was not woken by the release")
	}
	if wokeWithin(f.w2, 200*time.Millisecond) {
		t.Fatal("w2, not the head, was woken by the release")
	}
	testQueueFreeKey(f)
}

// testQueueFreeKey goes on after the release granted the key to the head w1,
// with w2 behind.
func testQueueFreeKey(f *queueFixture) {
	t, ctx := f.t, f.ctx
	if g, err := f.obs.Acquire(ctx, f.req("newcomer", 0)); !errors.Is(err, leasehold.ErrNotAcquired) || g.Ahead != 1 || g.Holder != "host-w1" || g.Remaining <= 0 {
		t.Fatalf("a newcomer after the grant to w1: expected ErrNotAcquired, w2 ahead, holder host-w1 with a TTL; got %+v, %v", g, err)
	}
	if _, err := f.s2.Acquire(ctx, f.req("w2", time.Minute)); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("w2 behind w1: expected ErrNotAcquired, got %v", err)
	}
	// The head gives up without taking its grant: its Release frees the
	// key, which goes to w2, who is woken.
	if err := f.s1.Release(ctx, "k", "w1"); err != nil {
		t.Fatalf("Release of a grant by the waiter that gives up: %v", err)
	}
	if !wokeWithin(f.w2, 3*time.Second) {
		t.Fatal("w2 was not woken when the head left")
	}
	if _, err := f.s2.Acquire(ctx, f.req("w2", time.Minute)); err != nil {
		t.Fatalf("w2 at the head: expected the key, got %v", err)
	}
	f.inspect("host-w2", 0, "")
	if err := f.s1.Release(ctx, "k", "w1"); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("Release by another token while w2 holds: expected ErrNotOwned, got %v", err)
	}
}

// A waiter's own deadline bounds its WaitRelease while the LISTEN
// connection cannot be opened (another waiter with a long deadline is
// waiting for the same connection).
func testListenHangs(t *testing.T, srv *testpg.Server) {
	dsn := srv.CreateDatabase(t)
	pool := testpg.Connect(t, dsn, pgxpool.New)
	release := make(chan struct{})
	s, err := pgstore.New(t.Context(), pool, pgstore.Options{
		Migrate: pgstore.MigrateCreate,
		Listen: func(ctx context.Context) (*pgx.Conn, error) {
			select { // a dial that hangs
			case <-release:
			case <-ctx.Done():
			}
			return nil, errors.New("dial hung")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer close(release)
	long, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	first := make(chan error, 1)
	go func() {
		_, stop, err := s.WaitRelease(long, "a", "w1")
		if err == nil {
			stop()
		}
		first <- err
	}()
	time.Sleep(100 * time.Millisecond)
	short, cancel2 := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel2()
	start := time.Now()
	_, _, err = s.WaitRelease(short, "b", "w2")
	if err == nil || errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("WaitRelease with the LISTEN dial hanging: expected a store error, got %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("WaitRelease with a 300ms deadline returned after %v", d)
	}
	cancel()
	<-first
}
