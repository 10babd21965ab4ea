package pgstore_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
	"github.com/leasehold/leasehold/storetest"
)

// TestConformance runs the shared suite against a real PostgreSQL, each
// subtest on its own database (the stores of one subtest are replicas over
// that database). Break refuses connections to the store's database (ALTER
// DATABASE ... ALLOW_CONNECTIONS false, which also binds superusers) and
// terminates its backends, so the pool and the LISTEN connection lose their
// sessions and cannot open new ones; Heal allows connections again and the
// pool and listener reconnect. FencesAhead moves the fence counter 10^12 µs
// ahead of the database clock.
func TestConformance(t *testing.T) {
	srv := testpg.Start(t)
	var (
		mu  sync.Mutex
		dsn = map[*testing.T]string{}
		dbs = map[leasehold.Store]string{}
	)
	dsnOf := func(t *testing.T) string {
		mu.Lock()
		defer mu.Unlock()
		if d, ok := dsn[t]; ok {
			return d
		}
		d := srv.CreateDatabase(t)
		dsn[t] = d
		return d
	}
	dbOf := func(s leasehold.Store) string {
		mu.Lock()
		defer mu.Unlock()
		return dbs[s]
	}
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) leasehold.Store {
			d := dsnOf(t)
			s := open(t, d, pgstore.Options{})
			mu.Lock()
			dbs[s] = dbName(t, d)
			mu.Unlock()
			return s
		},
		Break: func(t *testing.T, s leasehold.Store) { cutOff(t, srv, dbOf(s)) },
		Heal:  func(t *testing.T, s leasehold.Store) { restore(t, srv, dbOf(s)) },
		FencesAhead: func(t *testing.T, s leasehold.Store, _ []string) {
			fencesAhead(t, testpg.Connect(t, dsnOf(t)), s.(*pgstore.Store))
		},
	})
}

// fencesAhead moves the store's fence counter 10^12 µs (11.6 days) ahead of
// the database clock, as if the clock had stepped back that far.
func fencesAhead(t testing.TB, db *pgxpool.Pool, s *pgstore.Store) {
	t.Helper()
	_, err := db.Exec(context.Background(),
		"UPDATE "+strings.TrimSuffix(s.Table(), `"`)+`_counter" SET v = (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + 1000000000000`)
	if err != nil {
		t.Fatalf("move the fence sequence ahead: %v", err)
	}
}
