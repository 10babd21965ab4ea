package pgfence

import (
	"context"
	"errors"
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/fence"
)

// DB is what a Table needs from PostgreSQL. *pgxpool.Pool, *pgx.Conn and
// pgx.Tx satisfy it, so a fenced write can be part of the caller's own
// transaction (see Table.WithDB).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

var (
	_ DB = (*pgxpool.Pool)(nil)
	_ DB = (*pgx.Conn)(nil)
	_ DB = pgx.Tx(nil)
)

// maxIdentLen is PostgreSQL's NAMEDATALEN-1: longer names are silently
// truncated by the server, which could make two names one.
const maxIdentLen = 63

// TableOptions name a PostgreSQL table with a fence column and how it is
// reported. Identifiers are used exactly as given (case-sensitive) and quoted;
// they are never spliced into SQL unquoted.
type TableOptions struct {
	// Schema of the table. Default: none (the search_path decides).
	Schema string
	// Table is the table's name. Required.
	Table string
	// IDColumn identifies a row. It must be the primary key or carry a unique
	// constraint (Write's INSERT ... ON CONFLICT needs one). Ids are passed as
	// text parameters, so text, uuid and integer columns all work. Default "id".
	IDColumn string
	// DataColumn receives the written value as a []byte parameter: bytea,
	// jsonb, json and text columns work. Default "data".
	DataColumn string
	// FenceColumn holds the last accepted fence: bigint NOT NULL DEFAULT 0
	// (see MigrationSQL). Default "fence".
	FenceColumn string

	// Name is the locker name carried by events (Event.Locker), the metrics
	// label. Default "default".
	Name string
	// Resource names the table in events and errors (Event.Op). Default
	// "postgres".
	Resource string
	// Observer receives an EventStaleWrite for every rejected write. Default:
	// none.
	Observer leasehold.Observer
}

// Table writes rows of one PostgreSQL table guarded by a fence column. Each
// write is one round trip. A Table is safe for concurrent use when its DB is
// (a pool is; a pgx.Conn or pgx.Tx is not).
type Table struct {
	db  DB
	rep fence.Reporter
	id  string // quoted identifier, for error messages

	updateSQL  string
	upsertSQL  string
	readSQL    string
	migrateSQL string
}

var _ fence.Resource = (*Table)(nil)

// NewTable returns a Table over db. It validates the identifiers in opts and
// returns an error matching fence.ErrInvalidOptions that names the one to fix.
func NewTable(db DB, opts TableOptions) (*Table, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", fence.ErrInvalidOptions)
	}
	q, err := quote(opts)
	if err != nil {
		return nil, err
	}
	t := &Table{db: db, rep: fence.Reporter{Name: opts.Name, Resource: orDefault(opts.Resource, "postgres"), Observer: opts.Observer}, id: q.table}

	// The outer SELECT reads the statement's snapshot, not the CTE's change:
	// it tells "row missing" (NULL) apart from "row holds a newer fence"
	// within the same round trip.
	t.updateSQL = fmt.Sprintf(`WITH applied AS (
	UPDATE %[1]s SET %[3]s = $1, %[4]s = $2 WHERE %[2]s = $3 AND %[4]s <= $2 RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM applied), (SELECT %[4]s FROM %[1]s WHERE %[2]s = $3)`,
		q.table, q.id, q.data, q.fence)
	t.upsertSQL = fmt.Sprintf(`WITH applied AS (
	INSERT INTO %[1]s AS cur (%[2]s, %[3]s, %[4]s) VALUES ($1, $2, $3)
	ON CONFLICT (%[2]s) DO UPDATE SET %[3]s = EXCLUDED.%[3]s, %[4]s = EXCLUDED.%[4]s
	WHERE cur.%[4]s <= EXCLUDED.%[4]s
	RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM applied), (SELECT %[4]s FROM %[1]s WHERE %[2]s = $1)`,
		q.table, q.id, q.data, q.fence)
	t.readSQL = fmt.Sprintf(`SELECT %[3]s, %[4]s FROM %[1]s WHERE %[2]s = $1`, q.table, q.id, q.data, q.fence)
	t.migrateSQL = migration(q.table, q.fence)
	return t, nil
}

type quoted struct{ table, id, data, fence string }

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// quoteTable validates and quotes [schema.]table.
func quoteTable(schema, table string) (string, error) {
	if err := validIdent("Table", table); err != nil {
		return "", err
	}
	if schema == "" {
		return pgx.Identifier{table}.Sanitize(), nil
	}
	if err := validIdent("Schema", schema); err != nil {
		return "", err
	}
	return pgx.Identifier{schema, table}.Sanitize(), nil
}

// quoteColumn validates and quotes a column name, or its default.
func quoteColumn(field, name, def string) (string, error) {
	name = orDefault(name, def)
	if err := validIdent(field, name); err != nil {
		return "", err
	}
	return pgx.Identifier{name}.Sanitize(), nil
}

func quote(opts TableOptions) (q quoted, err error) {
	if q.table, err = quoteTable(opts.Schema, opts.Table); err != nil {
		return q, err
	}
	if q.id, err = quoteColumn("IDColumn", opts.IDColumn, "id"); err != nil {
		return q, err
	}
	if q.data, err = quoteColumn("DataColumn", opts.DataColumn, "data"); err != nil {
		return q, err
	}
	if q.fence, err = quoteColumn("FenceColumn", opts.FenceColumn, "fence"); err != nil {
		return q, err
	}
	switch {
	case q.id == q.data:
		return q, fmt.Errorf("%w: IDColumn and DataColumn are both %s", fence.ErrInvalidOptions, q.id)
	case q.id == q.fence:
		return q, fmt.Errorf("%w: IDColumn and FenceColumn are both %s", fence.ErrInvalidOptions, q.id)
	case q.data == q.fence:
		return q, fmt.Errorf("%w: DataColumn and FenceColumn are both %s", fence.ErrInvalidOptions, q.data)
	}
	return q, nil
}

func validIdent(field, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: %s is empty", fence.ErrInvalidOptions, field)
	case len(s) > maxIdentLen:
		return fmt.Errorf("%w: %s is %d bytes; PostgreSQL identifiers are at most %d", fence.ErrInvalidOptions, field, len(s), maxIdentLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s is not valid UTF-8", fence.ErrInvalidOptions, field)
	}
	for _, r := range s {
		if r == 0 {
			return fmt.Errorf("%w: %s contains a NUL byte", fence.ErrInvalidOptions, field)
		}
	}
	return nil
}

func migration(table, fence string) string {
	return fmt.Sprintf("ALTER TABLE %[1]s ADD COLUMN IF NOT EXISTS %[2]s bigint NOT NULL DEFAULT 0 CHECK (%[2]s >= 0)", table, fence)
}

// MigrationSQL returns the statement that adds the fence column to the table
// in opts (only Schema, Table and FenceColumn matter):
//
//	ALTER TABLE "jobs" ADD COLUMN IF NOT EXISTS "fence" bigint NOT NULL DEFAULT 0 CHECK ("fence" >= 0)
//
// Existing rows get fence 0, so the first fenced write to each wins. Running it
// twice is harmless. fence/pgfence/migrations/0001_fence_column.sql is the same
// statement for a table named jobs, for migration tools.
func MigrationSQL(opts TableOptions) (string, error) {
	table, err := quoteTable(opts.Schema, opts.Table)
	if err != nil {
		return "", err
	}
	col, err := quoteColumn("FenceColumn", opts.FenceColumn, "fence")
	if err != nil {
		return "", err
	}
	return migration(table, col), nil
}

// MigrationSQL returns the statement that adds this table's fence column; see
// the package-level MigrationSQL.
func (t *Table) MigrationSQL() string { return t.migrateSQL }

// Migrate runs MigrationSQL on the table's DB.
func (t *Table) Migrate(ctx context.Context) error {
	if _, err := t.db.Exec(ctx, t.migrateSQL); err != nil {
		return fmt.Errorf("fence: migrate %s: %w", t.id, err)
	}
	return nil
}

// WithDB returns a copy of t that uses db, typically a pgx.Tx, so that the
// fenced write commits or rolls back with the caller's other changes. Inside
// a transaction the write takes the row lock: a concurrent writer of the same
// row waits for the commit and then re-checks the fence. Nothing is accepted
// until the caller commits. At REPEATABLE READ or SERIALIZABLE isolation a
// concurrent write to the same row makes PostgreSQL abort the transaction
// (SQLSTATE 40001); that comes back as an error that does not match
// fence.ErrStaleFence: retry the transaction, which then sees the newer fence.
func (t *Table) WithDB(db DB) *Table {
	c := *t
	c.db = db
	return &c
}

// Write is the insert-if-absent write (Resource): it inserts row id with value
// and fence, or updates it when fence >= the row's fence, and otherwise
// returns a *StaleError (matching fence.ErrStaleFence) and changes nothing. One
// round trip (INSERT ... ON CONFLICT DO UPDATE ... WHERE fence <= EXCLUDED.fence).
func (t *Table) Write(ctx context.Context, id string, token uint64, value []byte) error {
	f, err := pgFence(token)
	if err != nil {
		return err
	}
	var current *int64 // NULL: no row in this statement's snapshot
	var applied bool
	err = t.db.QueryRow(ctx, t.upsertSQL, id, value, f).Scan(&applied, &current)
	switch {
	case err != nil:
		return fmt.Errorf("fence: write %s row %q: %w", t.id, id, err)
	case applied:
		return nil
	case current == nil: // inserted by a concurrent writer with a newer fence
		return t.rep.Stale(id, token, 0)
	}
	return t.rep.Stale(id, token, uint64(*current))
}

// Update changes the existing row id when fence >= the row's fence. It returns
// a *StaleError (matching fence.ErrStaleFence) when the row holds a newer fence and
// an error matching fence.ErrNotFound when there is no such row; nothing changes in
// either case. One round trip.
//
// Under concurrency, a row deleted by another transaction after this
// statement's snapshot was taken is reported as stale, not missing.
func (t *Table) Update(ctx context.Context, id string, token uint64, value []byte) error {
	f, err := pgFence(token)
	if err != nil {
		return err
	}
	var current *int64
	var applied bool
	err = t.db.QueryRow(ctx, t.updateSQL, value, f, id).Scan(&applied, &current)
	switch {
	case err != nil:
		return fmt.Errorf("fence: update %s row %q: %w", t.id, id, err)
	case applied:
		return nil
	case current == nil:
		return fmt.Errorf("%w: %s has no row %q", fence.ErrNotFound, t.id, id)
	}
	return t.rep.Stale(id, token, uint64(*current))
}

func pgFence(token uint64) (int64, error) {
	if err := fence.CheckFence(token); err != nil {
		return 0, err
	}
	if token > math.MaxInt64 {
		return 0, fmt.Errorf("%w: fence %d does not fit a bigint column", fence.ErrInvalidFence, token)
	}
	return int64(token), nil
}

// Read returns row id's value and fence, or an error matching fence.ErrNotFound.
func (t *Table) Read(ctx context.Context, id string) (value []byte, token uint64, err error) {
	var f int64
	err = t.db.QueryRow(ctx, t.readSQL, id).Scan(&value, &f)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, 0, fmt.Errorf("%w: %s row %q", fence.ErrNotFound, t.id, id)
	case err != nil:
		return nil, 0, fmt.Errorf("fence: read %s row %q: %w", t.id, id, err)
	}
	return value, uint64(f), nil
}
