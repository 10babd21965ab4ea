package pgstore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

// The UNLOGGED lock table warns once a standby streams; a Durable store
// warns under synchronous_commit off (the test server's setting) and not
// once the role commits synchronously. A role with only the store's
// privileges can run the check.
func TestCheckConfigDurability(t *testing.T) {
	srv := testpg.Start(t)
	dsn := srv.DSN()
	st := open(t, dsn, pgstore.Options{})
	ctx := ctx5(t)
	if ws, err := st.CheckConfig(ctx); err != nil || len(ws) != 0 {
		t.Fatalf("expected no warning without a standby, got %+v, %v", ws, err)
	}

	admin := testpg.Connect(t, dsn, pgxpool.New)
	for _, stmt := range []string{
		`CREATE ROLE svc LOGIN`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON leasehold_locks, leasehold_locks_waiters TO svc`,
		`GRANT SELECT, UPDATE ON leasehold_locks_counter TO svc`,
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	svc, err := pgstore.New(ctx, testpg.Connect(t, strings.Replace(dsn, "postgres@", "svc@", 1), pgxpool.New), pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()

	srv.StartStandby()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ws, err := svc.CheckConfig(ctx5(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(ws) == 1 && ws[0].Check == "pg_durability" && strings.Contains(ws[0].Seen, "UNLOGGED") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("expected an UNLOGGED warning with a standby streaming, got %+v", ws)
		}
		time.Sleep(100 * time.Millisecond)
	}

	durable := open(t, srv.CreateDatabase(t), pgstore.Options{Durable: true})
	ws, err := durable.CheckConfig(ctx)
	if err != nil || len(ws) != 1 || !strings.Contains(ws[0].Seen, "synchronous_commit off") {
		t.Fatalf("expected a synchronous_commit warning for a Durable store, got %+v, %v", ws, err)
	}
	if _, err := admin.Exec(ctx, `ALTER ROLE postgres SET synchronous_commit = on`); err != nil {
		t.Fatal(err)
	}
	durable2 := open(t, srv.CreateDatabase(t), pgstore.Options{Durable: true})
	if ws, err := durable2.CheckConfig(ctx); err != nil || len(ws) != 0 {
		t.Fatalf("expected no warning with synchronous_commit on, got %+v, %v", ws, err)
	}
}
