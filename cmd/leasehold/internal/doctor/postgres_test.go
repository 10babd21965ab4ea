package doctor

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

// migrate creates the store's objects (locks and semaphores) as the
// superuser of pool.
func migrate(t *testing.T, pool *pgxpool.Pool, opts pgstore.Options) {
	t.Helper()
	opts.Migrate = pgstore.MigrateCreate
	st, err := pgstore.New(t.Context(), pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

// A role without grants FAILs with the GRANT statements that fix it;
// running them (as the superuser) makes the check pass, so the printed
// SQL is valid and sufficient.
func TestPostgresPrivileges(t *testing.T) {
	srv := testpg.Start(t)
	admin := testpg.Connect(t, srv.DSN(), pgxpool.New)
	migrate(t, admin, pgstore.Options{})
	if _, err := admin.Exec(t.Context(), `CREATE ROLE "svc-role" LOGIN`); err != nil {
		t.Fatal(err)
	}
	svc := testpg.Connect(t, strings.Replace(srv.DSN(), "postgres@", "svc-role@", 1), pgxpool.New)
	var user string
	if err := svc.QueryRow(t.Context(), "SELECT current_user").Scan(&user); err != nil || user != "svc-role" {
		t.Fatalf("expected to connect as svc-role, got %q (%v)", user, err)
	}

	rs := Postgres(t.Context(), svc, pgstore.Options{}, Options{})
	for _, check := range []string{"pg_lock_privileges", "pg_semaphore_privileges"} {
		r := wantStatus(t, rs, check, Fail)
		if !strings.Contains(r.Fix, `TO "svc-role";`) {
			t.Fatalf("%s: expected GRANT statements naming the role, got %q", check, r.Fix)
		}
		if _, err := admin.Exec(t.Context(), r.Fix); err != nil {
			t.Fatalf("%s: the fix %q does not run: %v", check, r.Fix, err)
		}
	}
	lock := find(t, rs, "pg_lock_privileges")
	if !strings.Contains(lock.Fix, `GRANT SELECT, UPDATE ON "public"."leasehold_locks_counter"`) {
		t.Fatalf("expected the counter's grant, got %q", lock.Fix)
	}
	rs = Postgres(t.Context(), svc, pgstore.Options{}, Options{})
	wantStatus(t, rs, "pg_lock_privileges", OK)
	wantStatus(t, rs, "pg_semaphore_privileges", OK)

	// The granted role can really use the store.
	st, err := pgstore.New(t.Context(), svc, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Acquire(t.Context(), acquireReq("doctor-grants")); err != nil {
		t.Fatalf("expected the granted role to acquire, got %v", err)
	}
}

// Missing tables: the lock tables FAIL, the semaphore tables only WARN.
func TestPostgresMissingObjects(t *testing.T) {
	srv := testpg.Start(t)
	admin := testpg.Connect(t, srv.DSN(), pgxpool.New)
	rs := Postgres(t.Context(), admin, pgstore.Options{Table: "nothere"}, Options{})
	r := wantStatus(t, rs, "pg_lock_privileges", Fail)
	if !strings.Contains(r.Seen, `"public"."nothere"`) {
		t.Fatalf("expected the missing table named, got %q", r.Seen)
	}
	wantStatus(t, rs, "pg_semaphore_privileges", Warn)
	wantStatus(t, rs, "pg_durability", Skip)

	if _, err := admin.Exec(t.Context(), pgstore.MigrationSQL(pgstore.Options{Table: "nothere"})); err != nil {
		t.Fatal(err)
	}
	rs = Postgres(t.Context(), admin, pgstore.Options{Table: "nothere"}, Options{})
	wantStatus(t, rs, "pg_lock_privileges", OK)
	wantStatus(t, rs, "pg_semaphore_privileges", Warn)
}

// An UNLOGGED lock table WARNs only while a standby streams; a logged
// (Durable) one WARNs under synchronous_commit off (the test server's
// setting) and passes with it on.
func TestPostgresDurability(t *testing.T) {
	srv := testpg.Start(t)
	admin := testpg.Connect(t, srv.DSN(), pgxpool.New)
	migrate(t, admin, pgstore.Options{})
	ctx := t.Context()

	r := wantStatus(t, Postgres(ctx, admin, pgstore.Options{}, Options{}), "pg_durability", OK)
	if !strings.Contains(r.Seen, "UNLOGGED") || !strings.Contains(r.Seen, "0 standby") {
		t.Fatalf("expected an UNLOGGED table and no standby, got %q", r.Seen)
	}
	srv.StartStandby()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r = find(t, Postgres(ctx, admin, pgstore.Options{}, Options{}), "pg_durability")
		if r.Status == Warn || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r.Status != Warn || !strings.Contains(r.Fix, "SET LOGGED") {
		t.Fatalf("expected WARN with ALTER TABLE … SET LOGGED while a standby streams, got %+v", r)
	}
	if _, err := admin.Exec(ctx, strings.Split(r.Fix, "; and ")[0]); err != nil {
		t.Fatalf("the fix %q does not run: %v", r.Fix, err)
	}

	r = wantStatus(t, Postgres(ctx, admin, pgstore.Options{}, Options{}), "pg_durability", Warn)
	if !strings.Contains(r.Seen, "synchronous_commit off") {
		t.Fatalf("expected synchronous_commit off seen, got %q", r.Seen)
	}
	if _, err := admin.Exec(ctx, r.Fix); err != nil {
		t.Fatalf("the fix %q does not run: %v", r.Fix, err)
	}
	admin.Reset() // the role setting applies to new sessions
	wantStatus(t, Postgres(ctx, admin, pgstore.Options{}, Options{}), "pg_durability", OK)
}

// LISTEN on a direct connection receives the NOTIFY.
func TestPostgresListen(t *testing.T) {
	srv := testpg.Start(t)
	wantStatus(t, Postgres(t.Context(), testpg.Connect(t, srv.DSN(), pgxpool.New), pgstore.Options{}, Options{}), "pg_listen", OK)
}

// This host's clock set 10 s ahead of the database's WARNs; the true
// clock passes.
func TestPostgresClock(t *testing.T) {
	srv := testpg.Start(t)
	pool := testpg.Connect(t, srv.DSN(), pgxpool.New)
	wantStatus(t, Postgres(t.Context(), pool, pgstore.Options{}, Options{}), "pg_clock", OK)
	ahead := func() time.Time { return time.Now().Add(10 * time.Second) }
	r := wantStatus(t, Postgres(t.Context(), pool, pgstore.Options{}, Options{Now: ahead}), "pg_clock", Warn)
	if !strings.HasPrefix(r.Seen, "offset -9.9") && !strings.HasPrefix(r.Seen, "offset -10") {
		t.Fatalf("expected an offset of -10s, got %q", r.Seen)
	}
}

func acquireReq(key string) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Token: "doctor-test-token", TTL: time.Minute, Holder: "doctor-test"}
}
