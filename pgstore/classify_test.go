package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/internal/testtls"
	"github.com/leasehold/leasehold/pgstore"
)

// acquireFailOpen opens a store on dsn and tries a key on a FailOpen Locker
// over it. It returns the lease (nil when it failed closed) and the error of
// Open or of the acquire.
func acquireFailOpen(t *testing.T, dsn string, opts pgstore.Options) (*leasehold.Lease, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := pgstore.Open(ctx, dsn, opts)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = s.Close() })
	lk, err := leasehold.New(s, leasehold.Options{Name: "classify", OnStoreError: leasehold.FailOpen})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk.Close() })
	l, err := lk.TryAcquire(t.Context(), "k")
	if l != nil {
		t.Cleanup(func() { _ = l.Release(context.Background()) })
	}
	return l, err
}

// Configuration mistakes never fail open against a real PostgreSQL:
// a role without privileges, a database that does not exist, a server
// certificate from another CA, TLS required from a server without it for
// the client, a replication connection (replication=database copied from
// a CDC tool's DSN), and a URL that names a port speaking another
// protocol.
func TestMisconfigurationNeverFailsOpen(t *testing.T) {
	f, other := testtls.New(t), testtls.New(t)
	srv := testpg.Start(t)
	srv.EnableTLS(f.ServerCert, f.ServerKey)
	admin := testpg.Connect(t, srv.DSN(), pgxpool.New)
	open(t, srv.DSN(), pgstore.Options{Table: "classify_locks"}) // the tables exist
	if _, err := admin.Exec(t.Context(), "CREATE ROLE nopriv LOGIN"); err != nil {
		t.Fatal(err)
	}
	plain := testpg.Start(t)
	web := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(web.Close)
	base := func(user, host string, port int, query string) string {
		return fmt.Sprintf("postgres://%s@%s:%d/postgres?connect_timeout=5&%s", user, host, port, query)
	}
	webHost, webPort, _ := net.SplitHostPort(strings.TrimPrefix(web.URL, "http://"))
	var wp int
	fmt.Sscan(webPort, &wp)
	for _, tc := range []struct {
		name string
		dsn  string
		opts pgstore.Options
		want error
	}{
		{"role without privileges", base("nopriv", "127.0.0.1", srv.Port, "sslmode=disable"), pgstore.Options{Table: "classify_locks", Migrate: pgstore.MigrateNever}, leasehold.ErrAccessDenied},
		{"role that cannot create the tables", base("nopriv", "127.0.0.1", srv.Port, "sslmode=disable"), pgstore.Options{Table: "other_locks"}, leasehold.ErrAccessDenied},
		{"database that does not exist", fmt.Sprintf("postgres://%s@127.0.0.1:%d/nosuchdb?sslmode=disable", testpg.Superuser, srv.Port), pgstore.Options{}, leasehold.ErrMisconfigured},
		{"table that does not exist", base(testpg.Superuser, "127.0.0.1", srv.Port, "sslmode=disable"), pgstore.Options{Table: "missing_locks", Migrate: pgstore.MigrateNever}, leasehold.ErrMisconfigured},
		{"server certificate from another CA", base(testpg.Superuser, "127.0.0.1", srv.Port, "sslmode=verify-full&sslrootcert="+other.CA), pgstore.Options{Table: "classify_locks"}, leasehold.ErrMisconfigured},
		{"TLS required, server without TLS", base(testpg.Superuser, "127.0.0.1", plain.Port, "sslmode=require"), pgstore.Options{Table: "classify_locks"}, leasehold.ErrMisconfigured},
		{"replication connection (SQLSTATE 08P01 to every query)", base(testpg.Superuser, "127.0.0.1", srv.Port, "sslmode=disable&replication=database"), pgstore.Options{Table: "classify_locks"}, leasehold.ErrMisconfigured},
		{"postgres:// to an HTTP port", base(testpg.Superuser, webHost, wp, "sslmode=disable"), pgstore.Options{}, leasehold.ErrMisconfigured},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := acquireFailOpen(t, tc.dsn, tc.opts)
			if l != nil {
				t.Fatalf("expected no lease, got one (degraded %v)", l.Degraded())
			}
			if !errors.Is(err, tc.want) || errors.Is(err, leasehold.ErrUnavailable) {
				t.Fatalf("expected %v (and not ErrUnavailable), got %v", tc.want, err)
			}
			if tc.want == leasehold.ErrMisconfigured && errors.Is(err, leasehold.ErrAccessDenied) {
				t.Fatalf("expected a configuration error other than access denied, got %v", err)
			}
		})
	}
}

// An outage fails open: a server that stopped after the store opened, and
// a refused port at open is ErrUnavailable.
func TestOutageFailsOpen(t *testing.T) {
	srv := testpg.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	_, err = pgstore.Open(t.Context(), fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", testpg.Superuser, refused), pgstore.Options{})
	if !errors.Is(err, leasehold.ErrUnavailable) || errors.Is(err, leasehold.ErrMisconfigured) {
		t.Fatalf("refused port: expected ErrUnavailable, got %v", err)
	}

	s := open(t, srv.DSN(), pgstore.Options{Table: "outage_locks"})
	lk, err := leasehold.New(s, leasehold.Options{Name: "outage", OnStoreError: leasehold.FailOpen})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk.Close() })
	srv.Stop()
	l, err := lk.TryAcquire(t.Context(), "k")
	if err != nil || !l.Degraded() {
		t.Fatalf("server stopped: expected a degraded lease, got %v, %v", l, err)
	}
	_ = l.Release(t.Context())
}

// A read-only default (a role's, a database's or the URL's) is no
// outage: Open's sessions are read-write, so the store works, where it
// used to take SQLSTATE 25006, a standby's answer, for an outage and fail
// open for good.
func TestReadOnlyDefaultNeverFailsOpen(t *testing.T) {
	srv := testpg.Start(t)
	admin := testpg.Connect(t, srv.DSN(), pgxpool.New)
	open(t, srv.DSN(), pgstore.Options{Table: "readonly_locks"}) // the tables exist
	if _, err := admin.Exec(t.Context(), "CREATE ROLE ro LOGIN SUPERUSER; ALTER ROLE ro SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, user, query string }{
		{"role default", "ro", ""},
		{"URL options", testpg.Superuser, "&options=-c%20default_transaction_read_only%3Don"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5%s", tc.user, srv.Port, tc.query)
			l, err := acquireFailOpen(t, dsn, pgstore.Options{Table: "readonly_locks", Migrate: pgstore.MigrateNever})
			if err != nil || l.Degraded() {
				t.Fatalf("expected a lease from the store, got %v, %v", l, err)
			}
		})
	}
}

// The grants README.md lists under "Privileges" are enough for locks and
// semaphores with MigrateNever.
func TestDocumentedPrivilegesSuffice(t *testing.T) {
	srv := testpg.Start(t)
	open(t, srv.DSN(), pgstore.Options{})
	admin := testpg.Connect(t, srv.DSN(), pgxpool.New)
	for _, q := range []string{
		"CREATE ROLE app LOGIN",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON leasehold_locks, leasehold_locks_waiters, leasehold_locks_presence, leasehold_locks_permits, leasehold_locks_permit_queue, leasehold_locks_permit_limits TO app",
		"GRANT SELECT, UPDATE ON leasehold_locks_counter TO app",
	} {
		if _, err := admin.Exec(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	s := open(t, fmt.Sprintf("postgres://app@127.0.0.1:%d/postgres?sslmode=disable", srv.Port), pgstore.Options{Migrate: pgstore.MigrateNever})
	lk, err := leasehold.New(s, leasehold.Options{Name: "grants"})
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	l, err := lk.TryAcquire(t.Context(), "k")
	if err != nil {
		t.Fatalf("lock with the documented grants: %v", err)
	}
	_ = l.Release(t.Context())
	sem, err := lk.Semaphore("sem", 2)
	if err != nil {
		t.Fatal(err)
	}
	p, err := sem.TryAcquire(t.Context())
	if err != nil {
		t.Fatalf("semaphore permit with the documented grants: %v", err)
	}
	_ = p.Release(t.Context())
}
