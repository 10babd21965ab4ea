package storeurl_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/cmd/leasehold/internal/storeurl"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

func TestOpenPostgres(t *testing.T) {
	srv := testpg.Start(t)
	ctx := t.Context()
	dsn := srv.CreateDatabase(t)
	for i, scheme := range []string{"postgres", "postgresql"} {
		raw := strings.Replace(dsn, "postgres://", scheme+"://", 1) + fmt.Sprintf("&table=cli_locks_%d&schema=public", i)
		o, err := storeurl.Open(ctx, raw)
		if err != nil {
			t.Fatalf("Open(%q): %v", raw, err)
		}
		defer o.Close()
		if o.Kind != storeurl.Postgres || !o.Shared {
			t.Errorf("expected a shared postgres store, got kind %s shared %v", o.Kind, o.Shared)
		}
		g, err := o.Store.Acquire(ctx, driver.AcquireRequest{Key: "job", Token: "tok", TTL: 5 * time.Second})
		if err != nil || g.Fence == 0 {
			t.Fatalf("acquire: fence %d, %v", g.Fence, err)
		}
		if _, ok := o.Store.(driver.ForceReleaser); !ok {
			t.Errorf("postgres store is not a ForceReleaser")
		}
		if _, ok := o.Store.(driver.Notifier); !ok {
			t.Errorf("postgres store is not a Notifier")
		}
		// The table parameter named the table; it was not sent to the server
		// as a run-time parameter.
		var n int
		q := fmt.Sprintf("SELECT count(*) FROM cli_locks_%d WHERE key = 'job' AND token = 'tok'", i)
		if err := testpg.Connect(t, dsn, pgxpool.New).QueryRow(ctx, q).Scan(&n); err != nil || n != 1 {
			t.Errorf("expected the lock in cli_locks_%d, got %d rows, %v", i, n, err)
		}
	}

	// migrate=false on a database without the table: opens, then fails on
	// use with a store error (not contention).
	o, err := storeurl.Open(ctx, srv.CreateDatabase(t)+"&migrate=false")
	if err != nil {
		t.Fatalf("Open with migrate=false: %v", err)
	}
	defer o.Close()
	if _, err := o.Store.Acquire(ctx, driver.AcquireRequest{Key: "job", Token: "tok", TTL: time.Second}); err == nil || errors.Is(err, leasehold.ErrNotAcquired) {
		t.Errorf("acquire without a table: expected a store error, got %v", err)
	}
}

// A server that does not answer is unavailable, not a bad URL, and the
// error does not carry the password.
func TestOpenPostgresUnavailable(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, raw := range []string{
		"postgres://user:" + secret + "@127.0.0.1:1/db?sslmode=disable",
		"postgres://user@127.0.0.1:1/db?sslmode=disable&password=" + secret,
	} {
		_, err := storeurl.Open(ctx, raw)
		if !errors.Is(err, storeurl.ErrUnavailable) || errors.Is(err, storeurl.ErrBadURL) {
			t.Errorf("Open(%q): expected ErrUnavailable, got %v", storeurl.Describe(raw), err)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("error leaks the password: %v", err)
		}
	}
}

// A password the server checks and rejects: the error says so without the
// password, and Describe of the opened store hides it.
func TestPostgresPasswordRedacted(t *testing.T) {
	srv := testpg.Start(t)
	ctx := t.Context()
	admin := testpg.Connect(t, srv.DSN(), pgxpool.New)
	// Loopback is trusted by testpg's pg_hba.conf, so a wrong password is not
	// refused there; the role's VALID UNTIL in the past is, whatever the
	// password. Instead, check the error of a role that may not log in.
	if _, err := admin.Exec(ctx, "CREATE ROLE nologin_user NOLOGIN PASSWORD '"+secret+"'"); err != nil {
		t.Fatal(err)
	}
	raw := fmt.Sprintf("postgres://nologin_user:%s@127.0.0.1:%d/postgres?sslmode=disable", secret, srv.Port)
	_, err := storeurl.Open(ctx, raw)
	if !errors.Is(err, leasehold.ErrAccessDenied) || errors.Is(err, storeurl.ErrUnavailable) {
		t.Fatalf("expected ErrAccessDenied (never unavailable) for a role that may not log in, got %v", err)
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("error leaks the password: %v", err)
	}
	if !strings.Contains(err.Error(), "xxxxx") {
		t.Errorf("expected the redacted URL in the error, got %v", err)
	}

	if _, err := admin.Exec(ctx, "CREATE ROLE app LOGIN PASSWORD '"+secret+"'; GRANT CREATE ON SCHEMA public TO app"); err != nil {
		t.Fatal(err)
	}
	o, err := storeurl.Open(ctx, fmt.Sprintf("postgres://app:%s@127.0.0.1:%d/postgres?sslmode=disable", secret, srv.Port))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if strings.Contains(o.Desc, secret) || !strings.Contains(o.Desc, "app:xxxxx@") {
		t.Errorf("Desc: expected the password redacted, got %q", o.Desc)
	}
	if _, err := o.Store.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
}

// PostgresConfig parses what Open parses, without connecting: the password
// file, the store's own parameters and the TLS files; the pool's sessions
// are pinned to READ COMMITTED; no error shows the password.
func TestPostgresConfig(t *testing.T) {
	pwFile := t.TempDir() + "/pw"
	if err := os.WriteFile(pwFile, []byte("s3cr3tpw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	raw := "postgres://app@10.0.0.1:5433,10.0.0.2:5433/locks?table=t1&schema=s1&migrate=false" +
		"&password_file=" + pwFile + "&target_session_attrs=read-write"
	cfg, opts, err := storeurl.PostgresConfig(raw, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	cc := cfg.ConnConfig
	last := cc.Fallbacks[len(cc.Fallbacks)-1] // the second host (sslmode=prefer tries each host twice)
	if cc.Password != "s3cr3tpw" || cc.Host != "10.0.0.1" || cc.Port != 5433 || last.Host != "10.0.0.2" || cc.Database != "locks" {
		t.Errorf("expected app@10.0.0.1:5433,10.0.0.2 db locks with the file's password, got %s:%d, %s, db %s",
			cc.Host, cc.Port, last.Host, cc.Database)
	}
	if cc.RuntimeParams["default_transaction_isolation"] != "read committed" || cc.RuntimeParams["table"] != "" {
		t.Errorf("expected READ COMMITTED pinned and table not sent, got %v", cc.RuntimeParams)
	}
	if opts.Table != "t1" || opts.Schema != "s1" || opts.Migrate != pgstore.MigrateNever {
		t.Errorf("expected table t1, schema s1, migrate never, got %+v", opts)
	}
	for _, bad := range []string{
		"postgres://app:hunter2@host:5432/db?migrate=perhaps",
		"postgres://app:hunter2@host:5432/db?table=",
		"redis://app:hunter2@host:6379",
		"postgres://app:hunter2@host:notaport/db",
	} {
		_, _, err := storeurl.PostgresConfig(bad, nil)
		if !errors.Is(err, storeurl.ErrBadURL) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: expected ErrBadURL without the password, got %v", storeurl.Describe(bad), err)
		}
	}
}
