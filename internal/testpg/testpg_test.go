package testpg

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakePool stands in for *pgxpool.Pool: this package's module links no
// PostgreSQL driver.
type fakePool struct{ pinged, closed bool }

func (p *fakePool) Ping(context.Context) error { p.pinged = true; return nil }
func (p *fakePool) Close()                     { p.closed = true }

func TestStartQueryStop(t *testing.T) {
	s := Start(t)

	if got := s.Query("postgres", "SELECT 1"); got != "1" {
		t.Fatalf("expected SELECT 1 = 1, got %q", got)
	}
	if got := s.Query("postgres", "SELECT current_setting('fsync') || ' ' || current_setting('listen_addresses')"); got != "off 127.0.0.1" {
		t.Fatalf("expected fsync=off listen_addresses=127.0.0.1, got %s", got)
	}

	dsn := s.CreateDatabase(t)
	db := dsn[strings.LastIndex(dsn, "/")+1 : strings.Index(dsn, "?")]
	if got := s.Query(db, "SELECT current_database()"); got != db || db == "postgres" {
		t.Fatalf("expected a fresh database %s, got %q", db, got)
	}

	var pool *fakePool
	t.Run("Connect", func(t *testing.T) {
		pool = Connect(t, dsn, func(_ context.Context, got string) (*fakePool, error) {
			if got != dsn {
				return nil, errors.New("unexpected dsn " + got)
			}
			return &fakePool{}, nil
		})
		if !pool.pinged || pool.closed {
			t.Fatalf("expected a pinged, open pool, got %+v", *pool)
		}
	})
	if !pool.closed {
		t.Fatal("expected the pool closed in t.Cleanup")
	}

	dir := s.Dir
	s.Stop()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("expected %s removed after Stop, got %v", dir, err)
	}
	if _, err := s.p.Query(t.Context(), "postgres", "SELECT 1"); err == nil {
		t.Fatal("expected a query to fail after Stop")
	}
	s.Stop() // idempotent
}
