package pgstore_test

import (
	"sync"
	"testing"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
	"github.com/leasehold/leasehold/storetest"
)

// TestConformance runs the shared suite against a real PostgreSQL, each
// subtest on its own database. Break refuses connections to the store's
// database (ALTER DATABASE ... ALLOW_CONNECTIONS false, which also binds
// superusers) and terminates its backends, so the pool and the LISTEN
// connection lose their sessions and cannot open new ones; Heal allows
// connections again and the pool and listener reconnect.
func TestConformance(t *testing.T) {
	srv := testpg.Start(t)
	var (
		mu  sync.Mutex
		dbs = map[leasehold.Store]string{}
	)
	dbOf := func(s leasehold.Store) string {
		mu.Lock()
		defer mu.Unlock()
		return dbs[s]
	}
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) leasehold.Store {
			dsn := srv.CreateDatabase(t)
			s := open(t, dsn, pgstore.Options{})
			mu.Lock()
			dbs[s] = dbName(t, dsn)
			mu.Unlock()
			return s
		},
		Break: func(t *testing.T, s leasehold.Store) { cutOff(t, srv, dbOf(s)) },
		Heal:  func(t *testing.T, s leasehold.Store) { restore(t, srv, dbOf(s)) },
	})
}
