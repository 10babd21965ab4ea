// Package testpg starts a real PostgreSQL server for tests on a free loopback
// port, in its own temporary data directory, and stops it when the test ends.
// It is a testing.TB front for internal/pgproc, the launcher the drill's
// --store postgres-server shares.
//
// `make test` installs PostgreSQL (scripts/install-test-deps.sh); a test
// using this package fails, with a message saying so, when initdb or pg_ctl
// is missing. PostgreSQL refuses to run as root: when the test runs as uid 0
// the server runs as the "postgres" user (created by the Debian package), and
// the data directory is handed to that user.
//
// The server is tuned for tests, not durability: fsync, synchronous_commit
// and full_page_writes are off, and every loopback connection is trusted.
package testpg

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/pgproc"
)

// Superuser is the database superuser the server is initialised with.
const Superuser = pgproc.Superuser

// Server is one running PostgreSQL server (internal/pgproc, the launcher
// the drill shares).
type Server struct {
	// Port is the loopback TCP port the server listens on.
	Port int
	// Dir is the temporary directory holding the data directory, the unix
	// socket and the log; it is removed by Stop.
	Dir string

	p  *pgproc.Server
	tb testing.TB
}

// Bin returns the directory that holds the PostgreSQL binaries, or fails
// the test with a message saying what is missing and how to install it. It
// looks at $PATH first, then at Debian's /usr/lib/postgresql/<version>/bin
// (newest version first).
func Bin(tb testing.TB) string {
	tb.Helper()
	dir, err := pgproc.Bin()
	if err != nil {
		tb.Fatalf("testpg: %v: run `make test` or scripts/install-test-deps.sh", err)
	}
	return dir
}

// Start initialises a fresh cluster and starts PostgreSQL on a free loopback
// port; t.Cleanup stops it (pg_ctl stop -m immediate) and removes its files.
// Start takes about a second.
func Start(tb testing.TB) *Server {
	tb.Helper()
	Bin(tb)
	p, err := pgproc.Start(context.Background(), pgproc.Options{Settings: []string{"synchronous_commit=off"}})
	if err != nil {
		tb.Fatalf("testpg: start PostgreSQL: %v", err)
	}
	return wrap(tb, p)
}

func wrap(tb testing.TB, p *pgproc.Server) *Server {
	s := &Server{Port: p.Port, Dir: p.Dir, p: p, tb: tb}
	tb.Cleanup(s.Stop)
	return s
}

// Stop stops the server at once (pg_ctl stop -m immediate: no checkpoint,
// like a crash) and removes its files. It is called by t.Cleanup and is a
// no-op when the server is not running.
func (s *Server) Stop() {
	s.p.Close()
	s.Dir = ""
}

// DSN returns a connection string for database "postgres" as the superuser,
// over loopback TCP without TLS.
func (s *Server) DSN() string {
	return s.DatabaseDSN("postgres")
}

// DatabaseDSN returns a connection string for database db.
func (s *Server) DatabaseDSN(db string) string { return s.p.DSN(db) }

// Connect returns a connection pool for dsn made by open (pgxpool.New),
// pinged once and closed in t.Cleanup. The driver comes in as a parameter
// so that this package, part of the root module, links none: the modules
// whose tests use it already require pgx.
//
//	pool := testpg.Connect(t, s.DSN(), pgxpool.New)
func Connect[P Pool](tb testing.TB, dsn string, open func(context.Context, string) (P, error)) P {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := open(ctx, dsn)
	if err != nil {
		tb.Fatalf("testpg: connect: %v", err)
	}
	tb.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		tb.Fatalf("testpg: ping: %v", err)
	}
	return pool
}

// Pool is what Connect needs of a connection pool (*pgxpool.Pool).
type Pool interface {
	Ping(context.Context) error
	Close()
}

// Query runs sql in database db with psql and returns its output
// (unaligned, tuples only), failing the test on an error.
func (s *Server) Query(db, sql string) string {
	s.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := s.p.Query(ctx, db, sql)
	if err != nil {
		s.tb.Fatalf("testpg: %v", err)
	}
	return out
}

var dbSeq atomic.Uint64

// CreateDatabase creates a fresh, uniquely named database and returns its
// DSN: cheaper than a new server when tests need isolation.
func (s *Server) CreateDatabase(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("test_%d_%d", time.Now().UnixNano(), dbSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.p.Query(ctx, "postgres", "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("testpg: create database %s: %v", name, err)
	}
	return s.DatabaseDSN(name)
}
