package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/internal/resourcetest"
	"github.com/leasehold/leasehold/fence/pgfence"
	"github.com/leasehold/leasehold/fencetest"
	"github.com/leasehold/leasehold/internal/testpg"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var tableSeq atomic.Int64

// newTable creates a fresh table with the given column types and the fence
// column added by the package's migration, and returns its name.
func newTable(t *testing.T, pool *pgxpool.Pool, idType, dataType string) string {
	t.Helper()
	name := fmt.Sprintf("rows_%d", tableSeq.Add(1))
	ctx := t.Context()
	q := pgx.Identifier{name}.Sanitize()
	if _, err := pool.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (id %s PRIMARY KEY, data %s)", q, idType, dataType)); err != nil {
		t.Fatalf("create table: %v", err)
	}
	m, err := pgfence.MigrationSQL(pgfence.TableOptions{Table: name})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, m); err != nil {
		t.Fatalf("migration %q: %v", m, err)
	}
	return name
}

func TestPostgres(t *testing.T) {
	pool := testpg.Connect(t, testpg.Start(t).DSN(), pgxpool.New)

	mk := func(t *testing.T) resourcetest.Subject {
		name := newTable(t, pool, "text", "bytea")
		obs := &resourcetest.Counter{}
		tbl, err := pgfence.NewTable(pool, pgfence.TableOptions{Table: name, Name: "approval", Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		return resourcetest.Subject{Res: tbl, Read: tbl.Read, Obs: obs, Resource: "postgres"}
	}
	t.Run("Conformance", func(t *testing.T) { resourcetest.Run(t, mk) })

	t.Run("UpdateMissingVsStale", func(t *testing.T) {
		ctx := t.Context()
		obs := &resourcetest.Counter{}
		tbl, err := pgfence.NewTable(pool, pgfence.TableOptions{Table: newTable(t, pool, "text", "jsonb"), Name: "approval", Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		if err := tbl.Update(ctx, "nope", 5, []byte(`{}`)); !errors.Is(err, fence.ErrNotFound) || errors.Is(err, fence.ErrStaleFence) {
			t.Fatalf("update of a missing row: expected ErrNotFound only, got %v", err)
		}
		if err := tbl.Write(ctx, "r1", 5, []byte(`{"by":"a"}`)); err != nil {
			t.Fatal(err)
		}
		if err := tbl.Update(ctx, "r1", 5, []byte(`{"by":"a2"}`)); err != nil {
			t.Fatalf("update with an equal fence: %v", err)
		}
		if err := tbl.Update(ctx, "r1", 6, []byte(`{"by":"b"}`)); err != nil {
			t.Fatalf("update with a higher fence: %v", err)
		}
		err = tbl.Update(ctx, "r1", 5, []byte(`{"by":"stale"}`))
		var se *fence.StaleError
		if !errors.As(err, &se) || errors.Is(err, fence.ErrNotFound) || se.Current != 6 || se.Fence != 5 {
			t.Fatalf("update with a lower fence: expected StaleError{Fence:5 Current:6}, got %v", err)
		}
		if v, f, _ := tbl.Read(ctx, "r1"); string(v) != `{"by": "b"}` || f != 6 {
			t.Fatalf(`expected {"by": "b"}@6, got %s@%d`, v, f)
		}
		if n := len(obs.Stale()); n != 1 {
			t.Fatalf("expected 1 stale event (ErrNotFound is not stale), got %d", n)
		}
	})

	t.Run("ColumnTypes", func(t *testing.T) {
		ctx := t.Context()
		for _, c := range []struct{ id, data, key, value string }{
			{"bigint", "text", "42", "hello"},
			{"uuid", "jsonb", "7d444840-9dc0-11d1-b245-5ffdce74fad2", `[1, 2]`},
			{"integer", "json", "7", `{"a":1}`},
		} {
			tbl, err := pgfence.NewTable(pool, pgfence.TableOptions{Table: newTable(t, pool, c.id, c.data)})
			if err != nil {
				t.Fatal(err)
			}
			if err := tbl.Write(ctx, c.key, 3, []byte(c.value)); err != nil {
				t.Fatalf("%s/%s: write: %v", c.id, c.data, err)
			}
			if err := tbl.Update(ctx, c.key, 3, []byte(c.value)); err != nil {
				t.Fatalf("%s/%s: update: %v", c.id, c.data, err)
			}
			if err := tbl.Write(ctx, c.key, 2, []byte(c.value)); !errors.Is(err, fence.ErrStaleFence) {
				t.Fatalf("%s/%s: expected ErrStaleFence, got %v", c.id, c.data, err)
			}
			if v, f, err := tbl.Read(ctx, c.key); err != nil || string(v) != c.value || f != 3 {
				t.Fatalf("%s/%s: expected %s@3, got %s@%d (%v)", c.id, c.data, c.value, v, f, err)
			}
		}
	})

	t.Run("Transaction", func(t *testing.T) {
		ctx := t.Context()
		tbl, err := pgfence.NewTable(pool, pgfence.TableOptions{Table: newTable(t, pool, "text", "text")})
		if err != nil {
			t.Fatal(err)
		}
		for _, commit := range []bool{false, true} {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := tbl.WithDB(tx).Write(ctx, "tx", 9, []byte("in tx")); err != nil {
				t.Fatalf("write in tx: %v", err)
			}
			if commit {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			_, f, err := tbl.Read(ctx, "tx")
			switch {
			case !commit && !errors.Is(err, fence.ErrNotFound):
				t.Fatalf("after rollback: expected ErrNotFound, got fence %d, %v", f, err)
			case commit && (err != nil || f != 9):
				t.Fatalf("after commit: expected fence 9, got %d, %v", f, err)
			}
		}
	})

	t.Run("HostileIdentifiers", func(t *testing.T) {
		ctx := t.Context()
		if _, err := pool.Exec(ctx, `CREATE TABLE y (id int)`); err != nil {
			t.Fatal(err)
		}
		hostile := `x"; DROP TABLE y; --`
		col := `d"ata; DELETE FROM y`
		q := pgx.Identifier{hostile}.Sanitize()
		if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id text PRIMARY KEY, %s bytea)`, q, pgx.Identifier{col}.Sanitize())); err != nil {
			t.Fatal(err)
		}
		obs := &resourcetest.Counter{}
		tbl, err := pgfence.NewTable(pool, pgfence.TableOptions{Table: hostile, DataColumn: col, FenceColumn: `f'ence`, Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		if err := tbl.Migrate(ctx); err != nil {
			t.Fatalf("migrate a hostile name: %v", err)
		}
		if err := tbl.Migrate(ctx); err != nil {
			t.Fatalf("migrate twice: %v", err)
		}
		if err := tbl.Write(ctx, `'; DROP TABLE y; --`, 2, []byte("v")); err != nil {
			t.Fatalf("write: %v", err)
		}
		if err := tbl.Write(ctx, `'; DROP TABLE y; --`, 1, []byte("v")); !errors.Is(err, fence.ErrStaleFence) {
			t.Fatalf("expected ErrStaleFence, got %v", err)
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM y`).Scan(&n); err != nil {
			t.Fatalf("table y must survive: %v", err)
		}
		if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s`, q)).Scan(&n); err != nil || n != 1 {
			t.Fatalf("expected 1 row in the hostile table, got %d (%v)", n, err)
		}
	})

	t.Run("Schema", func(t *testing.T) {
		ctx := t.Context()
		if _, err := pool.Exec(ctx, `CREATE SCHEMA "App"; CREATE TABLE "App".jobs (id text PRIMARY KEY, data text)`); err != nil {
			t.Fatal(err)
		}
		tbl, err := pgfence.NewTable(pool, pgfence.TableOptions{Schema: "App", Table: "jobs"})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(tbl.MigrationSQL(), `ALTER TABLE "App"."jobs" ADD COLUMN IF NOT EXISTS "fence" bigint`) {
			t.Fatalf("unexpected migration %q", tbl.MigrationSQL())
		}
		if err := tbl.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if err := tbl.Write(ctx, "1", 1, []byte("x")); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("MigrationFile", func(t *testing.T) {
		ctx := t.Context()
		sql, err := os.ReadFile("migrations/0001_fence_column.sql")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `CREATE TABLE jobs (id text PRIMARY KEY, data jsonb); INSERT INTO jobs VALUES ('old', '{}')`); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, string(sql)); err != nil {
			t.Fatalf("run migration file: %v", err)
		}
		want, _ := pgfence.MigrationSQL(pgfence.TableOptions{Table: "jobs"})
		if !strings.Contains(string(sql), want+";") {
			t.Fatalf("migration file and MigrationSQL differ: file lacks %q", want)
		}
		tbl, err := pgfence.NewTable(pool, pgfence.TableOptions{Table: "jobs"})
		if err != nil {
			t.Fatal(err)
		}
		if _, f, err := tbl.Read(ctx, "old"); err != nil || f != 0 {
			t.Fatalf("existing row: expected fence 0, got %d (%v)", f, err)
		}
		if err := tbl.Update(ctx, "old", 1, []byte(`{"v":1}`)); err != nil {
			t.Fatalf("first fenced write to an existing row: %v", err)
		}
		if _, err := pool.Exec(ctx, `UPDATE jobs SET fence = -1`); err == nil {
			t.Fatal("expected the CHECK constraint to refuse a negative fence")
		}
	})

	t.Run("Validation", func(t *testing.T) {
		for _, o := range []pgfence.TableOptions{
			{},
			{Table: "t", IDColumn: "x", DataColumn: "x"},
			{Table: "t", FenceColumn: "id"},
			{Table: "t\x00u"},
			{Table: strings.Repeat("t", 64)},
			{Table: "t", Schema: "\xff"},
		} {
			if _, err := pgfence.NewTable(pool, o); !errors.Is(err, fence.ErrInvalidOptions) {
				t.Errorf("NewTable(%+v): expected ErrInvalidOptions, got %v", o, err)
			}
		}
		if _, err := pgfence.NewTable(nil, pgfence.TableOptions{Table: "t"}); !errors.Is(err, fence.ErrInvalidOptions) {
			t.Errorf("nil db: expected ErrInvalidOptions, got %v", err)
		}
		if _, err := pgfence.MigrationSQL(pgfence.TableOptions{}); !errors.Is(err, fence.ErrInvalidOptions) {
			t.Errorf("MigrationSQL without a table: expected ErrInvalidOptions, got %v", err)
		}
		tbl, err := pgfence.NewTable(pool, pgfence.TableOptions{Table: newTable(t, pool, "text", "text")})
		if err != nil {
			t.Fatal(err)
		}
		if err := tbl.Write(t.Context(), "k", math.MaxInt64+1, nil); !errors.Is(err, fence.ErrInvalidFence) {
			t.Errorf("fence > MaxInt64: expected ErrInvalidFence, got %v", err)
		}
		if err := tbl.Write(t.Context(), "k", math.MaxInt64, []byte("max")); err != nil {
			t.Errorf("fence MaxInt64: %v", err)
		}
	})

	t.Run("ContextCanceled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		tbl, err := pgfence.NewTable(pool, pgfence.TableOptions{Table: "jobs"})
		if err != nil {
			t.Fatal(err)
		}
		err = tbl.Write(ctx, "k", 1, nil)
		if err == nil || errors.Is(err, fence.ErrStaleFence) || !errors.Is(err, context.Canceled) {
			t.Fatalf("expected a non-stale error wrapping context.Canceled, got %v", err)
		}
	})
}

// fencetest drives the table like a fleet of lease holders, some paused past
// their TTL, and checks the history with porcupine.
func TestPostgresHistory(t *testing.T) {
	pool := testpg.Connect(t, testpg.Start(t).DSN(), pgxpool.New)
	tbl, err := pgfence.NewTable(pool, pgfence.TableOptions{Table: newTable(t, pool, "text", "bytea")})
	if err != nil {
		t.Fatal(err)
	}
	res, err := fencetest.Run(t.Context(), tbl, tbl.Read, fencetest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d ops: %d accepted, %d rejected as stale", len(res.Ops), res.Accepted, res.Rejected)
}
