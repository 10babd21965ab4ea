package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
)

// Defaults used for zero Options fields.
const (
	DefaultSchema = "public"
	DefaultTable  = "leasehold_locks"
)

// maxIdentLen is PostgreSQL's NAMEDATALEN-1: the server silently truncates
// longer names, which could make two names one.
const maxIdentLen = 63

// ErrClosed is returned by WaitRelease after Close.
var ErrClosed = errors.New("pgstore: store closed")

// ErrNoListener is returned by WaitRelease when the store has no way to open
// the dedicated LISTEN connection (see Options.Listen). A Locker then waits
// for the holder's TTL instead.
var ErrNoListener = errors.New("pgstore: no LISTEN connection configured")

// DB is what a Store needs from PostgreSQL for its queries. *pgxpool.Pool
// satisfies it. Every method of the Store is one call of one of these.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// poolConfiger is how a Store finds the connection settings of a pool, to
// open its own LISTEN connection (*pgxpool.Pool has it).
type poolConfiger interface {
	Config() *pgxpool.Config
}

var (
	_ DB           = (*pgxpool.Pool)(nil)
	_ poolConfiger = (*pgxpool.Pool)(nil)

	_ leasehold.Store         = (*Store)(nil)
	_ leasehold.Notifier      = (*Store)(nil)
	_ leasehold.ForceReleaser = (*Store)(nil)
	_ leasehold.BatchRenewer  = (*Store)(nil)
)

// Migration says whether New and Open create the lock table and the fence
// sequence.
type Migration int

const (
	// MigrateDefault (the zero value) is MigrateNever for New and
	// MigrateCreate for Open.
	MigrateDefault Migration = iota
	// MigrateCreate creates the table and the sequence when they are missing
	// (CREATE ... IF NOT EXISTS, under an advisory lock). It needs the CREATE
	// privilege on the schema.
	MigrateCreate
	// MigrateNever issues no DDL: the table and sequence must exist (see
	// MigrationSQL), and a user with only SELECT, INSERT, UPDATE, DELETE on
	// the table and USAGE, UPDATE on the sequence is enough.
	MigrateNever
)

// Options configure a Store. The zero value means the documented defaults.
// Identifiers are used exactly as given (case-sensitive) and always quoted.
type Options struct {
	// Schema of the lock table and the fence sequence. Default "public".
	Schema string
	// Table is the lock table. Default "leasehold_locks".
	Table string
	// Sequence mints fences. Default Table + "_fence".
	Sequence string
	// Channel is the LISTEN/NOTIFY channel on which releases publish the
	// key. Default Schema + "." + Table (at most 63 bytes).
	Channel string

	// Migrate says whether to create the table and the sequence. Default:
	// New does not, Open does.
	Migrate Migration

	// Listen opens the dedicated connection the store LISTENs on (LISTEN
	// needs one connection of its own, outside any pool). Default: when db
	// has a Config() *pgxpool.Config method (a *pgxpool.Pool does), a new
	// connection with the pool's connection settings; otherwise none, and
	// WaitRelease returns ErrNoListener.
	Listen func(ctx context.Context) (*pgx.Conn, error)

	// Logger receives a warning when the LISTEN connection is lost and a
	// message when it is back. Default: no logging.
	Logger *slog.Logger

	// ReconnectDelay is the longest wait between attempts to re-open a lost
	// LISTEN connection (attempts back off from 50 ms up to it). Default 5 s.
	ReconnectDelay time.Duration
}

// Store is a leasehold.Store, Notifier and ForceReleaser over one PostgreSQL
// table. It is safe for concurrent use. Close stops its LISTEN connection
// (and closes the pool when Open created it).
type Store struct {
	db        DB
	ownedPool *pgxpool.Pool // set by Open
	table     string        // quoted, schema-qualified
	seq       string        // quoted, schema-qualified
	channel   string        // raw channel name, for pg_notify($n)
	opts      Options
	names     [3]string // schema, table, sequence (raw)

	acquireSQL, renewSQL, renewBatchSQL, releaseSQL, inspectSQL, listSQL, forceSQL string

	lis       listener
	closeOnce sync.Once
}

// New returns a Store over db. With Migrate: MigrateCreate it creates the
// table and the sequence when missing; otherwise it does not contact the
// database. Close the Store before db.
func New(ctx context.Context, db DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: pgstore: db is nil", leasehold.ErrInvalidOptions)
	}
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	if opts.Listen == nil {
		if pc, ok := db.(poolConfiger); ok {
			cfg := pc.Config().ConnConfig
			opts.Listen = func(ctx context.Context) (*pgx.Conn, error) {
				return pgx.ConnectConfig(ctx, cfg.Copy())
			}
		}
	}
	s := &Store{
		db:      db,
		table:   pgx.Identifier{opts.Schema, opts.Table}.Sanitize(),
		seq:     pgx.Identifier{opts.Schema, opts.Sequence}.Sanitize(),
		channel: opts.Channel,
		opts:    opts,
		names:   [3]string{opts.Schema, opts.Table, opts.Sequence},
	}
	s.buildSQL()
	s.lis.init(s)
	if opts.Migrate == MigrateCreate {
		if err := s.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Open connects a pool to dsn (a URL or keyword/value string that pgx
// parses) and returns a Store over it. The Store owns the pool: Close closes
// it. Open pings the database and, unless opts.Migrate is MigrateNever,
// creates the table and the sequence when missing.
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	check := opts // bad options fail before any connection
	if err := check.setDefaults(); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: pgstore: %w", leasehold.ErrInvalidOptions, err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pgstore: connect: %w", err)
	}
	if opts.Migrate == MigrateDefault {
		opts.Migrate = MigrateCreate
	}
	s, err := New(ctx, pool, opts)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.ownedPool = pool
	return s, nil
}

func (o *Options) setDefaults() error {
	if o.Schema == "" {
		o.Schema = DefaultSchema
	}
	if o.Table == "" {
		o.Table = DefaultTable
	}
	if o.Sequence == "" {
		o.Sequence = o.Table + "_fence"
	}
	if o.Channel == "" {
		o.Channel = o.Schema + "." + o.Table
	}
	for _, f := range []struct{ name, v string }{
		{"Schema", o.Schema}, {"Table", o.Table}, {"Sequence", o.Sequence}, {"Channel", o.Channel},
	} {
		if len(f.v) > maxIdentLen {
			hint := ""
			if f.name == "Sequence" || f.name == "Channel" {
				hint = fmt.Sprintf(" (derived from Schema and Table; set Options.%s)", f.name)
			}
			return fmt.Errorf("%w: pgstore: %s %q is %d bytes, PostgreSQL names are at most %d%s",
				leasehold.ErrInvalidOptions, f.name, f.v, len(f.v), maxIdentLen, hint)
		}
		if strings.IndexByte(f.v, 0) >= 0 {
			return fmt.Errorf("%w: pgstore: %s contains a NUL byte", leasehold.ErrInvalidOptions, f.name)
		}
	}
	switch {
	case o.Migrate < MigrateDefault || o.Migrate > MigrateNever:
		return fmt.Errorf("%w: pgstore: unknown Migrate value %d", leasehold.ErrInvalidOptions, o.Migrate)
	case o.ReconnectDelay < 0:
		return fmt.Errorf("%w: pgstore: ReconnectDelay must be >= 0, got %v", leasehold.ErrInvalidOptions, o.ReconnectDelay)
	case o.ReconnectDelay == 0:
		o.ReconnectDelay = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Table returns the quoted, schema-qualified name of the lock table.
func (s *Store) Table() string { return s.table }

// Sequence returns the quoted, schema-qualified name of the fence sequence.
func (s *Store) Sequence() string { return s.seq }

// Channel returns the NOTIFY channel on which releases publish the key.
func (s *Store) Channel() string { return s.channel }

func checkKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: key is empty", leasehold.ErrInvalidKey)
	}
	return nil
}

// micros converts a TTL to whole microseconds (PostgreSQL's resolution).
func micros(ttl time.Duration) (int64, error) {
	us := ttl.Microseconds()
	if us < 1 {
		return 0, fmt.Errorf("%w: pgstore: TTL must be at least 1µs, got %v", leasehold.ErrInvalidOptions, ttl)
	}
	return us, nil
}

func storeErr(op, key string, err error) error {
	return fmt.Errorf("pgstore: %s %q: %w", op, key, err)
}

func remaining(us int64) time.Duration { return max(time.Duration(us)*time.Microsecond, 0) }

// Acquire implements leasehold.Store in one statement: an INSERT ... ON
// CONFLICT DO UPDATE that takes a free or expired row, or refreshes our own
// (same fence), and otherwise reads the holder's remaining TTL.
func (s *Store) Acquire(ctx context.Context, req leasehold.AcquireRequest) (leasehold.Grant, error) {
	key, token, ttl := req.Key, req.Token, req.TTL
	if err := checkKey(key); err != nil {
		return leasehold.Grant{}, err
	}
	us, err := micros(ttl)
	if err != nil {
		return leasehold.Grant{}, err
	}
	var (
		won   bool
		fence int64
		rem   int64
	)
	err = s.db.QueryRow(ctx, s.acquireSQL, key, token, us, s.seq).Scan(&won, &fence, &rem)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// A concurrent acquisition committed after this statement's snapshot:
		// the row was locked by ON CONFLICT but is not visible to the fallback
		// read. Held, remaining unknown.
		return leasehold.Grant{}, leasehold.ErrNotAcquired
	case err != nil:
		return leasehold.Grant{}, storeErr("acquire", key, err)
	case !won:
		return leasehold.Grant{Remaining: remaining(rem)}, leasehold.ErrNotAcquired
	case fence <= 0:
		return leasehold.Grant{}, storeErr("acquire", key, fmt.Errorf("sequence %s returned fence %d", s.seq, fence))
	}
	return leasehold.Grant{Fence: uint64(fence)}, nil
}

// Renew implements leasehold.Store: a token-checked UPDATE of expires_at.
func (s *Store) Renew(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := checkKey(key); err != nil {
		return err
	}
	us, err := micros(ttl)
	if err != nil {
		return err
	}
	tag, err := s.db.Exec(ctx, s.renewSQL, key, token, us)
	if err != nil {
		return storeErr("renew", key, err)
	}
	if tag.RowsAffected() == 0 {
		return leasehold.ErrNotOwned
	}
	return nil
}

// RenewBatch implements leasehold.BatchRenewer: every renewal in one UPDATE
// over unnest'ed arrays, one round trip. A key missing from its result was
// not owned.
func (s *Store) RenewBatch(ctx context.Context, reqs []leasehold.RenewRequest) []error {
	errs := make([]error, len(reqs))
	keys := make([]string, 0, len(reqs))
	tokens := make([]string, 0, len(reqs))
	ttls := make([]int64, 0, len(reqs))
	for i, r := range reqs {
		if err := checkKey(r.Key); err != nil {
			errs[i] = err
			continue
		}
		us, err := micros(r.TTL)
		if err != nil {
			errs[i] = err
			continue
		}
		keys, tokens, ttls = append(keys, r.Key), append(tokens, r.Token), append(ttls, us)
	}
	if len(keys) == 0 {
		return errs
	}
	renewed := make(map[string]bool, len(keys))
	rows, err := s.db.Query(ctx, s.renewBatchSQL, keys, tokens, ttls)
	if err == nil {
		for rows.Next() {
			var k string
			if err = rows.Scan(&k); err != nil {
				break
			}
			renewed[k] = true
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	for i, r := range reqs {
		switch {
		case errs[i] != nil:
		case err != nil:
			errs[i] = storeErr("renew", r.Key, err)
		case !renewed[r.Key]:
			errs[i] = leasehold.ErrNotOwned
		}
	}
	return errs
}

// Release implements leasehold.Store: a token-checked DELETE and a
// pg_notify of the key, in one statement.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	tag, err := s.db.Exec(ctx, s.releaseSQL, key, token, s.channel)
	if err != nil {
		return storeErr("release", key, err)
	}
	if tag.RowsAffected() == 0 {
		return leasehold.ErrNotOwned
	}
	return nil
}

// Inspect implements leasehold.Store. Facts hold the table, the channel and
// the acquisition and expiry times by the database clock (RFC 3339, UTC).
func (s *Store) Inspect(ctx context.Context, key string) (leasehold.LockInfo, error) {
	if err := checkKey(key); err != nil {
		return leasehold.LockInfo{}, err
	}
	rows, err := s.db.Query(ctx, s.inspectSQL, key)
	if err != nil {
		return leasehold.LockInfo{}, storeErr("inspect", key, err)
	}
	infos, err := s.collect(rows)
	if err != nil {
		return leasehold.LockInfo{}, storeErr("inspect", key, err)
	}
	if len(infos) == 0 {
		return leasehold.LockInfo{}, leasehold.ErrNotHeld
	}
	return infos[0], nil
}

// List implements leasehold.Store: the unexpired rows whose key starts with
// prefix (LIKE with % and _ escaped), in byte order (COLLATE "C").
func (s *Store) List(ctx context.Context, prefix string) ([]leasehold.LockInfo, error) {
	rows, err := s.db.Query(ctx, s.listSQL, likePrefix(prefix))
	if err != nil {
		return nil, storeErr("list", prefix, err)
	}
	infos, err := s.collect(rows)
	if err != nil {
		return nil, storeErr("list", prefix, err)
	}
	return infos, nil
}

// ForceRelease implements leasehold.ForceReleaser: it deletes key's row
// whatever its token, and notifies waiters. An expired row is deleted too but
// reported as ErrNotHeld.
func (s *Store) ForceRelease(ctx context.Context, key string) (leasehold.LockInfo, error) {
	if err := checkKey(key); err != nil {
		return leasehold.LockInfo{}, err
	}
	rows, err := s.db.Query(ctx, s.forceSQL, key, s.channel)
	if err != nil {
		return leasehold.LockInfo{}, storeErr("force release", key, err)
	}
	infos, err := s.collect(rows)
	if err != nil {
		return leasehold.LockInfo{}, storeErr("force release", key, err)
	}
	if len(infos) == 0 {
		return leasehold.LockInfo{}, leasehold.ErrNotHeld
	}
	return infos[0], nil
}

// collect reads rows of (key, token, fence, remaining µs, acquired_at,
// expires_at, live) and keeps the live ones.
func (s *Store) collect(rows pgx.Rows) ([]leasehold.LockInfo, error) {
	defer rows.Close()
	var out []leasehold.LockInfo
	for rows.Next() {
		var (
			li                leasehold.LockInfo
			fence, rem        int64
			acquired, expires time.Time
			live              bool
		)
		if err := rows.Scan(&li.Key, &li.Token, &fence, &rem, &acquired, &expires, &live); err != nil {
			return nil, err
		}
		if !live {
			continue
		}
		li.Fence = uint64(max(fence, 0))
		li.Remaining = remaining(rem)
		li.Facts = map[string]string{
			"table":       s.table,
			"sequence":    s.seq,
			"channel":     s.channel,
			"acquired_at": acquired.UTC().Format(time.RFC3339Nano),
			"expires_at":  expires.UTC().Format(time.RFC3339Nano),
		}
		out = append(out, li)
	}
	return out, rows.Err()
}

// likePrefix returns a LIKE pattern (ESCAPE '\') matching strings that start
// with prefix.
func likePrefix(prefix string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return r.Replace(prefix) + "%"
}

// Migrate creates the lock table and the fence sequence when they are
// missing, in one transaction under an advisory lock (so replicas starting
// together do not race). New and Open call it as Options.Migrate says.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.db.Exec(ctx, s.migrateSQL()); err != nil {
		return fmt.Errorf("pgstore: create %s and %s (or set Migrate: MigrateNever and run MigrationSQL yourself): %w", s.table, s.seq, err)
	}
	return nil
}

// Close stops the LISTEN connection and waits for its goroutine, then closes
// the pool if Open created it. Later WaitRelease calls return ErrClosed; when
// the Store came from New, the other methods keep working. Close is
// idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.lis.close()
		if s.ownedPool != nil {
			s.ownedPool.Close()
		}
	})
	return nil
}
