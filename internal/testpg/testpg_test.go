package testpg

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartQueryStop(t *testing.T) {
	s := Start(t)
	pool := s.Pool(t)
	ctx := t.Context()

	var one int
	if err := pool.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("expected SELECT 1 = 1, got %d (%v)", one, err)
	}
	var fsync, listen string
	if err := pool.QueryRow(ctx, "SELECT current_setting('fsync'), current_setting('listen_addresses')").Scan(&fsync, &listen); err != nil {
		t.Fatal(err)
	}
	if fsync != "off" || listen != "127.0.0.1" {
		t.Fatalf("expected fsync=off listen_addresses=127.0.0.1, got %s %s", fsync, listen)
	}

	dsn := s.CreateDatabase(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect to fresh database: %v", err)
	}
	defer conn.Close(context.Background())
	var db string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil || db == "postgres" {
		t.Fatalf("expected a fresh database, got %q (%v)", db, err)
	}

	dir := s.Dir
	s.Stop()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("expected %s removed after Stop, got %v", dir, err)
	}
	if err := pool.Ping(ctx); err == nil {
		t.Fatal("expected ping to fail after Stop")
	}
	s.Stop() // idempotent
}
