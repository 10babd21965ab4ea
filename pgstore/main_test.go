package pgstore_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// open opens a Store on dsn with opts and closes it in t.Cleanup.
func open(t testing.TB, dsn string, opts pgstore.Options) *pgstore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := pgstore.Open(ctx, dsn, opts)
	if err != nil {
		t.Fatalf("pgstore.Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// dbName returns the database name of a testpg DSN.
func dbName(t testing.TB, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

// cutOff refuses new connections to db and terminates the existing ones (the
// store's pool and its LISTEN connection): to the store, the database is gone.
func cutOff(t testing.TB, srv *testpg.Server, db string) {
	t.Helper()
	admin := testpg.Connect(t, srv.DSN(), pgxpool.New)
	ctx := context.Background()
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" ALLOW_CONNECTIONS false"); err != nil {
		t.Fatalf("cut off %s: %v", db, err)
	}
	terminate(t, srv, "datname = $1", db)
}

// terminate ends the backends of other sessions matching where (with args).
func terminate(t testing.TB, srv *testpg.Server, where string, args ...any) {
	t.Helper()
	admin := testpg.Connect(t, srv.DSN(), pgxpool.New)
	ctx := context.Background()
	q := "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND " + where
	if _, err := admin.Exec(ctx, q, args...); err != nil {
		t.Fatalf("terminate backends: %v", err)
	}
}

// restore lets connections to db in again.
func restore(t testing.TB, srv *testpg.Server, db string) {
	t.Helper()
	admin := testpg.Connect(t, srv.DSN(), pgxpool.New)
	if _, err := admin.Exec(context.Background(), "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" ALLOW_CONNECTIONS true"); err != nil {
		t.Fatalf("restore %s: %v", db, err)
	}
}
