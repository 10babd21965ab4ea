package pgstore_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
	"github.com/leasehold/leasehold/storetest"
)

// harnessStore is what the conformance harness knows of each store it made.
type harnessStore struct {
	db string // database name
	mu sync.Mutex
	// hung makes the store's LISTEN dial hang; listenPID is the backend of
	// its current LISTEN connection.
	hung      chan struct{}
	listenPID uint32
}

// TestConformance runs the shared suite against a real PostgreSQL, each
// subtest on its own database (the stores of one subtest are replicas over
// that database). Break refuses connections to the store's database (ALTER
// DATABASE ... ALLOW_CONNECTIONS false, which also binds superusers) and
// terminates its backends, so the pool and the LISTEN connection lose their
// sessions and cannot open new ones; Heal allows connections again and the
// pool and listener reconnect. Freeze stops (SIGSTOP) the postmaster and
// the database's backends; HangNotify ends the LISTEN connection and makes
// its re-dial hang. FencesAhead moves the fence floor 10^12 µs ahead of the
// database clock.
func TestConformance(t *testing.T) {
	srv := testpg.Start(t)
	var (
		mu  sync.Mutex
		dsn = map[*testing.T]string{}
		hs  = map[driver.Store]*harnessStore{}
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
	of := func(s driver.Store) *harnessStore {
		mu.Lock()
		defer mu.Unlock()
		return hs[s]
	}
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) driver.Store {
			d := dsnOf(t)
			h := &harnessStore{db: dbName(t, d)}
			s := open(t, d, pgstore.Options{Listen: h.listen(d)})
			mu.Lock()
			hs[s] = h
			mu.Unlock()
			return s
		},
		Break: func(t *testing.T, s driver.Store) { cutOff(t, srv, of(s).db) },
		Heal:  func(t *testing.T, s driver.Store) { restore(t, srv, of(s).db) },
		Freeze: func(t *testing.T, s driver.Store) func() {
			return freeze(t, srv, of(s).db)
		},
		HangNotify: func(t *testing.T, s driver.Store) func() {
			return of(s).hangNotify(t, srv)
		},
		FencesAhead: func(t *testing.T, s driver.Store, _ []string) {
			fencesAhead(t, testpg.Connect(t, dsnOf(t), pgxpool.New), s.(*pgstore.Store))
		},
		Leftovers: func(t *testing.T) []string {
			// The stores ran in nested subtests, each on its own database.
			mu.Lock()
			var dsns []string
			for st, d := range dsn {
				if strings.HasPrefix(st.Name(), t.Name()+"/") {
					dsns = append(dsns, d)
				}
			}
			mu.Unlock()
			var out []string
			for _, d := range dsns {
				out = append(out, leftRows(t, testpg.Connect(t, d, pgxpool.New))...)
			}
			return out
		},
	})
}

// leftRows lists the rows of the default lock and waiter tables except the
// documented fence state: the fence counter, the free rows (empty token)
// that a release keeps until a sweep deletes them, and expired rows (the
// lock ended by the database's clock; the next acquire takes the row).
func leftRows(t *testing.T, db *pgxpool.Pool) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT 'lock ' || key || ' ' || token FROM public.leasehold_locks WHERE token <> '' AND expires_at > clock_timestamp()
UNION ALL SELECT 'waiter ' || key || ' ' || token || CASE WHEN queued THEN ' (queued)' ELSE ' (subscription)' END FROM public.leasehold_locks_waiters`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// listen dials the LISTEN connection, or hangs until ctx ends while the
// store's notification path is made to hang.
func (h *harnessStore) listen(dsn string) func(ctx context.Context) (*pgx.Conn, error) {
	return func(ctx context.Context) (*pgx.Conn, error) {
		h.mu.Lock()
		hung := h.hung
		h.mu.Unlock()
		if hung != nil {
			select {
			case <-hung:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			h.mu.Lock()
			h.listenPID = conn.PgConn().PID()
			h.mu.Unlock()
		}
		return conn, err
	}
}

func (h *harnessStore) hangNotify(t *testing.T, srv *testpg.Server) func() {
	h.mu.Lock()
	h.hung = make(chan struct{})
	pid := h.listenPID
	h.mu.Unlock()
	if pid != 0 {
		terminate(t, srv, "pid = $1", int(pid))
	}
	return func() {
		h.mu.Lock()
		close(h.hung)
		h.hung = nil
		h.mu.Unlock()
	}
}

// freeze stops the postmaster (no new sessions) and every backend of db
// (no answers), without closing a connection.
func freeze(t *testing.T, srv *testpg.Server, db string) (thaw func()) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(srv.Dir, "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(raw), "\n")
	postmaster, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		t.Fatal(err)
	}
	admin := testpg.Connect(t, srv.DSN(), pgxpool.New)
	rows, err := admin.Query(t.Context(), "SELECT pid FROM pg_stat_activity WHERE datname = $1", db)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	pids = append(pids, postmaster)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	var once sync.Once
	thawAll := func() {
		once.Do(func() {
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
		})
	}
	t.Cleanup(thawAll)
	return thawAll
}

// fencesAhead moves the store's fence floor 10^12 µs (11.6 days) ahead of
// the database clock, as if the clock had stepped back that far.
func fencesAhead(t testing.TB, db *pgxpool.Pool, s *pgstore.Store) {
	t.Helper()
	_, err := db.Exec(context.Background(),
		"UPDATE "+strings.TrimSuffix(s.Table(), `"`)+`_counter" SET v = (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + 1000000000000`)
	if err != nil {
		t.Fatalf("move the fence floor ahead: %v", err)
	}
}

// TestLiveness runs storetest's randomized liveness test: each replica is a
// Store with its own pool and LISTEN connection over one database.
func TestLiveness(t *testing.T) {
	srv := testpg.Start(t)
	storetest.RunLiveness(t, storetest.Harness{
		New: func(t *testing.T) driver.Store { return open(t, srv.DSN(), pgstore.Options{}) },
	}, 0)
}
