package doctor

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/pgstore"
)

// Postgres runs every PostgreSQL check with pool, for the store objects
// that opts names (schema and table; defaults as pgstore's). It reads the
// catalog and the settings of its own session and creates nothing but a
// short-lived LISTEN connection.
func Postgres(ctx context.Context, pool *pgxpool.Pool, opts pgstore.Options, o Options) []Result {
	o = o.withDefaults()
	if opts.Schema == "" {
		opts.Schema = pgstore.DefaultSchema
	}
	if opts.Table == "" {
		opts.Table = pgstore.DefaultTable
	}
	locks := pgObjects{
		tables: []pgTable{
			{opts.Table, "SELECT, INSERT, UPDATE, DELETE"},
			{opts.Table + "_waiters", "SELECT, INSERT, UPDATE, DELETE"},
			{opts.Table + "_presence", "SELECT, INSERT, UPDATE, DELETE"},
			{opts.Table + "_counter", "SELECT, UPDATE"},
		},
		funcs: []string{opts.Table + "_acquire4", opts.Table + "_release3", opts.Table + "_force_release", opts.Table + "_subscribe"},
	}
	sems := pgObjects{
		tables: []pgTable{
			{opts.Table + "_permits", "SELECT, INSERT, UPDATE, DELETE"},
			{opts.Table + "_permit_queue", "SELECT, INSERT, UPDATE, DELETE"},
			{opts.Table + "_permit_limits", "SELECT, INSERT, UPDATE, DELETE"},
		},
		funcs: []string{opts.Table + "_acquire_permit", opts.Table + "_release_permit"},
	}
	return []Result{
		pgPrivileges(ctx, pool, "pg_lock_privileges", opts.Schema, locks, true),
		pgPrivileges(ctx, pool, "pg_semaphore_privileges", opts.Schema, sems, false),
		pgDurability(ctx, pool, opts),
		pgListen(ctx, pool),
		pgClock(ctx, pool, o),
	}
}

type pgTable struct{ name, privileges string }

type pgObjects struct {
	tables []pgTable
	funcs  []string
}

func pgError(check string, err error) Result {
	return Result{Check: check, Status: Fail, Seen: "query failed: " + firstLine(err.Error()),
		Why: "doctor could not read the catalog, and neither may the service", Fix: "check the connection and the role's CONNECT privilege"}
}

// pgPrivileges checks that the objects exist and that the current role has
// the privileges the store's statements need (pgstore's README.md,
// Privileges). Missing privileges FAIL; missing objects FAIL when required
// (the lock tables) and WARN otherwise (the semaphore tables).
func pgPrivileges(ctx context.Context, db *pgxpool.Pool, check, schema string, objs pgObjects, required bool) Result {
	var g grants
	if err := db.QueryRow(ctx, `SELECT current_user, coalesce(has_schema_privilege(current_user, n.oid, 'USAGE'), false)
		FROM (SELECT 1) one LEFT JOIN pg_namespace n ON n.nspname = $1`, schema).Scan(&g.role, &g.usage); err != nil {
		return pgError(check, err)
	}
	if !g.usage {
		g.lack("USAGE on schema "+schema, fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s;", pgx.Identifier{schema}.Sanitize(), g.quotedRole()))
	}
	for _, t := range objs.tables {
		if err := g.table(ctx, db, pgx.Identifier{schema, t.name}.Sanitize(), t.privileges); err != nil {
			return pgError(check, err)
		}
	}
	for _, f := range objs.funcs {
		if err := g.function(ctx, db, schema, f); err != nil {
			return pgError(check, err)
		}
	}
	return privilegeResult(check, g, required)
}

// grants collects what a role lacks and the statements that grant it.
type grants struct {
	role                         string
	usage                        bool
	missing, lacking, statements []string
}

func (g *grants) quotedRole() string { return pgx.Identifier{g.role}.Sanitize() }

func (g *grants) lack(what, grant string) {
	g.lacking = append(g.lacking, what)
	g.statements = append(g.statements, grant)
}

// table checks the table qname and the privileges (comma-separated) on it.
func (g *grants) table(ctx context.Context, db *pgxpool.Pool, qname, privileges string) error {
	var exists bool
	var have []string
	err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL,
		coalesce(array(SELECT p FROM unnest(string_to_array($2, ', ')) p
			WHERE to_regclass($1) IS NOT NULL AND has_table_privilege(current_user, to_regclass($1), p)), '{}')`,
		qname, privileges).Scan(&exists, &have)
	switch {
	case err != nil:
		return err
	case !exists:
		g.missing = append(g.missing, qname)
	case len(have) != len(strings.Split(privileges, ", ")):
		g.lack(privileges+" on "+qname, fmt.Sprintf("GRANT %s ON %s TO %s;", privileges, qname, g.quotedRole()))
	}
	return nil
}

// function checks EXECUTE on every function named name in schema.
func (g *grants) function(ctx context.Context, db *pgxpool.Pool, schema, name string) error {
	rows, err := db.Query(ctx, `SELECT p.oid::regprocedure::text, has_function_privilege(current_user, p.oid, 'EXECUTE')
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1 AND p.proname = $2`, schema, name)
	if err != nil {
		return err
	}
	found := false
	var sig string
	var ok bool
	_, err = pgx.ForEachRow(rows, []any{&sig, &ok}, func() error {
		found = true
		if !ok {
			g.lack("EXECUTE on "+sig, fmt.Sprintf("GRANT EXECUTE ON FUNCTION %s TO %s;", sig, g.quotedRole()))
		}
		return nil
	})
	if err == nil && !found {
		g.missing = append(g.missing, pgx.Identifier{schema, name}.Sanitize()+"()")
	}
	return err
}

func privilegeResult(check string, g grants, required bool) Result {
	switch {
	case len(g.lacking) > 0:
		seen := "role " + g.role + " lacks " + strings.Join(g.lacking, "; ")
		if len(g.missing) > 0 {
			seen += "; missing " + strings.Join(g.missing, ", ")
		}
		return Result{Check: check, Status: Fail, Seen: seen,
			Why: "every acquire, renewal or release that touches these objects fails with a permission error, so the service cannot take or keep a lock",
			Fix: strings.Join(g.statements, " ")}
	case len(g.missing) > 0 && required:
		return Result{Check: check, Status: Fail, Seen: "missing " + strings.Join(g.missing, ", "),
			Why: "the store cannot take a lock without its tables and functions",
			Fix: "run the store's migration once as a role with CREATE on the schema: open it with migrate (the default of leasehold's URLs and pgstore.Open), or run pgstore.MigrationSQL"}
	case len(g.missing) > 0:
		return Result{Check: check, Status: Warn, Seen: "missing " + strings.Join(g.missing, ", "),
			Why: "semaphores (run --limit, Semaphore) fail with a configuration error until these exist; plain locks are unaffected",
			Fix: "run pgstore.SemaphoreMigrationSQL once as a role with CREATE on the schema, or open the store with migrate"}
	}
	return Result{Check: check, Status: OK, Seen: "role " + g.role + " has every privilege the store needs"}
}

// pgDurability reports how the lock table survives a crash and a failover:
// an UNLOGGED table (the default) with a streaming standby WARNs (a
// promotion loses every lock), a logged table (Durable) under
// synchronous_commit off WARNs (a crash loses acknowledged acquires).
func pgDurability(ctx context.Context, db *pgxpool.Pool, opts pgstore.Options) Result {
	const check = "pg_durability"
	qname := pgx.Identifier{opts.Schema, opts.Table}.Sanitize()
	var persistence, syncCommit, role string
	var standbys int
	var inRecovery bool
	err := db.QueryRow(ctx, `SELECT coalesce((SELECT relpersistence::text FROM pg_class WHERE oid = to_regclass($1)), ''),
		current_setting('synchronous_commit'), (SELECT count(*) FROM pg_stat_replication), pg_is_in_recovery(), current_user`,
		qname).Scan(&persistence, &syncCommit, &standbys, &inRecovery, &role)
	if err != nil {
		return pgError(check, err)
	}
	seen := fmt.Sprintf("synchronous_commit %s, %d standby(s) streaming", syncCommit, standbys)
	switch {
	case inRecovery:
		return Result{Check: check, Status: Fail, Seen: "connected to a standby (pg_is_in_recovery)",
			Why: "a standby is read-only: no lock can be taken", Fix: "point the URL at the primary"}
	case persistence == "":
		return Result{Check: check, Status: Skip, Seen: qname + " does not exist", Fix: "create the store's tables first (see pg_lock_privileges)"}
	case persistence == "u" && standbys > 0:
		return Result{Check: check, Status: Warn, Seen: qname + " is UNLOGGED, " + seen,
			Why: "standbys receive no rows of an UNLOGGED table, so promoting one loses every lock while its holders still run (fences stay ordered)",
			Fix: fmt.Sprintf("ALTER TABLE %s SET LOGGED; ALTER TABLE %s SET LOGGED; and Durable: true in the services' pgstore.Options",
				qname, pgx.Identifier{opts.Schema, opts.Table + "_waiters"}.Sanitize())}
	case persistence == "u":
		return Result{Check: check, Status: OK, Seen: qname + " is UNLOGGED (the default: a crash loses locks, never fence order), " + seen}
	case syncCommit == "off":
		return Result{Check: check, Status: Warn, Seen: qname + " is logged (Durable), " + seen,
			Why: "with synchronous_commit off an acknowledged acquire can vanish in a crash, so a logged table does not make locks durable",
			Fix: fmt.Sprintf("ALTER ROLE %s SET synchronous_commit = on;", pgx.Identifier{role}.Sanitize())}
	}
	return Result{Check: check, Status: OK, Seen: qname + " is logged (Durable: locks survive a crash and reach standbys; services should set Durable: true), " + seen}
}

// pgListen checks that a dedicated connection, as the store opens for
// LISTEN, stays one server session and receives a notification: behind
// PgBouncer in transaction mode it does neither.
func pgListen(ctx context.Context, db *pgxpool.Pool) Result {
	const check = "pg_listen"
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, db.Config().ConnConfig.Copy())
	if err != nil {
		return pgError(check, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	channel := fmt.Sprintf("leasehold_doctor_%d", time.Now().UnixNano())
	var pid1, pid2 int
	if err := conn.QueryRow(cctx, "SELECT pg_backend_pid()").Scan(&pid1); err != nil {
		return pgError(check, err)
	}
	if _, err := conn.Exec(cctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return pgError(check, err)
	}
	if err := conn.QueryRow(cctx, "SELECT pg_backend_pid()").Scan(&pid2); err != nil {
		return pgError(check, err)
	}
	if _, err := db.Exec(cctx, "SELECT pg_notify($1, 'doctor')", channel); err != nil {
		return pgError(check, err)
	}
	wctx, wcancel := context.WithTimeout(cctx, 3*time.Second)
	defer wcancel()
	_, werr := conn.WaitForNotification(wctx)
	if pid1 == pid2 && werr == nil {
		return Result{Check: check, Status: OK, Seen: "a LISTEN connection received a NOTIFY"}
	}
	seen := "a LISTEN connection received no NOTIFY within 3s"
	if pid1 != pid2 {
		seen = fmt.Sprintf("one connection ran on server sessions %d and %d (a pooler in transaction mode)", pid1, pid2)
	}
	return Result{Check: check, Status: Warn, Seen: seen,
		Why: "waiters learn of a release by NOTIFY: without it they wait for the holder's TTL and hand-off takes seconds instead of milliseconds",
		Fix: "give the store a LISTEN connection that bypasses PgBouncer (pgstore.Options.Listen, or a URL to the server itself), or run PgBouncer in session mode"}
}

func pgClock(ctx context.Context, db *pgxpool.Pool, o Options) Result {
	const check = "pg_clock"
	var server time.Time
	// Connect first, so the measurement is one round trip.
	conn, err := db.Acquire(ctx)
	if err != nil {
		return pgError(check, err)
	}
	defer conn.Release()
	before := o.Now()
	err = conn.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&server)
	after := o.Now()
	if err != nil {
		return pgError(check, err)
	}
	return clockResult(check, "PostgreSQL", "run NTP (chrony or systemd-timesyncd) on this host and the database server, slewing rather than stepping the clock", o, before, server, after)
}
