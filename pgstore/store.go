package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold/driver"
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

	_ driver.Store          = (*Store)(nil)
	_ driver.Inspector      = (*Store)(nil)
	_ driver.Notifier       = (*Store)(nil)
	_ driver.ForceReleaser  = (*Store)(nil)
	_ driver.BatchRenewer   = (*Store)(nil)
	_ driver.QueueRefresher = (*Store)(nil)
	_ driver.PresenceKeeper = (*Store)(nil)
)

// Migration says whether New and Open create (or upgrade) the store's
// objects.
type Migration int

const (
	// MigrateDefault (the zero value) is MigrateNever for New and
	// MigrateCreate for Open.
	MigrateDefault Migration = iota
	// MigrateCreate creates the store's tables and functions when missing
	// and upgrades those of an older version (see MigrationSQL), under an
	// advisory lock. It needs the CREATE privilege on the schema.
	MigrateCreate
	// MigrateNever issues no DDL: the objects must exist (see MigrationSQL
	// and README.md, "Privileges").
	MigrateNever
)

// Options configure a Store. The zero value means the documented defaults.
// Schema and Table must match [a-z_][a-z0-9_]* and Channel
// [a-z_][a-z0-9_.]* (what PostgreSQL folds an unquoted name to), so no name
// can break out of the store's SQL whatever the quoting.
type Options struct {
	// Schema of the store's tables and functions. Default "public".
	Schema string
	// Table is the lock table. Default "leasehold_locks". The other objects
	// are named after it: Table+"_waiters", Table+"_counter",
	// Table+"_presence", Table+"_acquire4", Table+"_release3",
	// Table+"_force_release", Table+"_subscribe", and for older versions
	// Table+"_acquire3", Table+"_acquire2", Table+"_acquire",
	// Table+"_release2" and Table+"_release".
	Table string
	// Channel is the LISTEN/NOTIFY channel on which a release wakes the
	// key's waiters. Default Schema + "." + Table (at most 63 bytes).
	Channel string

	// Migrate says whether to create the store's objects. Default: New does
	// not, Open does.
	Migrate Migration

	// Durable keeps locks across a database crash: Migrate creates logged
	// lock, waiter and presence tables, and acquire and release commit
	// durably. By default those tables are UNLOGGED and acquire and release
	// commit with synchronous_commit off: a crash loses the locks (never the
	// fence order); see README.md, "Durability".
	Durable bool

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

// Store is a driver.Store, Inspector, Notifier, BatchRenewer, QueueRefresher,
// PresenceKeeper and ForceReleaser over PostgreSQL. It is safe for concurrent use. Close stops
// its LISTEN connection (and closes the pool when Open created it).
type Store struct {
	db        DB
	ownedPool *pgxpool.Pool // set by Open
	n         names
	channel   string // raw channel name, for pg_notify($n)
	opts      Options

	acquireSQL, releaseSQL, subscribeSQL, renewSQL, renewBatchSQL, refreshSQL, inspectSQL, listSQL, forceSQL string
	unsubscribeSQL, acquireBatchSQL, releaseBatchSQL, sweepSQL, acquireFastSQL, releaseFastSQL, presenceSQL  string

	id string // random, unique to the store: its observers' subscription rows

	lis      listener
	acquires *batcher[acquireCall]
	releases *batcher[releaseCall]
	sweep    sweeper
	free     freeKeys // keys whose row this store's last release kept free
	// presenceSweep is when KeepPresence next deletes old presences (Unix
	// ns): at most once per sweepEvery, as the free rows.
	presenceSweep atomic.Int64
	closeOnce     sync.Once
}

// New returns a Store over db. With Migrate: MigrateCreate it creates the
// store's objects when missing; otherwise it does not contact the database.
// Close the Store before db.
//
// The store's statements expect READ COMMITTED; under a stricter
// default_transaction_isolation they retry serialization failures (SQLSTATE
// 40001), so contention stays contention.
func New(ctx context.Context, db DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: pgstore: db is nil", driver.ErrInvalidOptions)
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
		n:       newNames(opts.Schema, opts.Table),
		channel: opts.Channel,
		opts:    opts,
		id:      newID(),
	}
	s.buildSQL()
	s.lis.init(s)
	s.acquires, s.releases = newBatcher(s.sendAcquires), newBatcher(s.sendReleases)
	s.sweep.next = time.Now().Add(sweepEvery)
	if opts.Migrate == MigrateCreate {
		if err := s.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Open connects a pool to dsn (a URL or keyword/value string that pgx
// parses) and returns a Store over it. The Store owns the pool: Close closes
// it. The pool's sessions run at READ COMMITTED and read-write whatever the
// database's, role's or URL's defaults, so that a read-only transaction
// (SQLSTATE 25006, an outage) means a standby. Open pings the database and, unless opts.Migrate is
// MigrateNever, creates the store's objects when missing.
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	check := opts // bad options fail before any connection
	if err := check.setDefaults(); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: pgstore: %w", driver.ErrInvalidOptions, err)
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read committed"
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "off" // 25006 only from a standby, an outage
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: connect: %w", classify(err))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pgstore: connect: %w", classify(err))
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
	if o.Channel == "" {
		o.Channel = o.Schema + "." + o.Table
	}
	for _, f := range []struct{ name, v, hint string }{
		{"Schema", o.Schema, ""},
		{"Table", o.Table + longestSuf, fmt.Sprintf(" (with the suffix %q of the store's longest object name)", longestSuf)},
		{"Channel", o.Channel, " (derived from Schema and Table; set Options.Channel)"},
	} {
		if len(f.v) > maxIdentLen {
			return fmt.Errorf("%w: pgstore: %s %q is %d bytes%s, PostgreSQL names are at most %d",
				driver.ErrInvalidOptions, f.name, f.v, len(f.v), f.hint, maxIdentLen)
		}
	}
	for _, f := range []struct {
		name, v string
		re      *regexp.Regexp
	}{{"Schema", o.Schema, identRE}, {"Table", o.Table, identRE}, {"Channel", o.Channel, channelRE}} {
		if !f.re.MatchString(f.v) {
			return fmt.Errorf("%w: pgstore: %s %q must match %s", driver.ErrInvalidOptions, f.name, f.v, f.re)
		}
	}
	switch {
	case o.Migrate < MigrateDefault || o.Migrate > MigrateNever:
		return fmt.Errorf("%w: pgstore: unknown Migrate value %d", driver.ErrInvalidOptions, o.Migrate)
	case o.ReconnectDelay < 0:
		return fmt.Errorf("%w: pgstore: ReconnectDelay must be >= 0, got %v", driver.ErrInvalidOptions, o.ReconnectDelay)
	case o.ReconnectDelay == 0:
		o.ReconnectDelay = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Table returns the quoted, schema-qualified name of the lock table.
func (s *Store) Table() string { return s.n.locks }

// Channel returns the NOTIFY channel on which releases wake waiters.
func (s *Store) Channel() string { return s.channel }

func checkKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: key is empty", driver.ErrInvalidKey)
	}
	return nil
}

// identRE and channelRE are the names Options accepts.
var (
	identRE   = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
	channelRE = regexp.MustCompile(`^[a-z_][a-z0-9_.]*$`)
)

// micros converts a TTL to whole microseconds (PostgreSQL's resolution).
func micros(ttl time.Duration) (int64, error) {
	us := ttl.Microseconds()
	if us < 1 {
		return 0, fmt.Errorf("%w: pgstore: TTL must be at least 1µs, got %v", driver.ErrInvalidOptions, ttl)
	}
	return us, nil
}

// batchArgs checks the n requests of a batch (request i is at(i): key,
// token, TTL) and returns each invalid one's error in errs, and the valid
// ones' indexes (order) with their keys, tokens and TTLs in µs as arrays
// sorted by key: the order in which every batch statement takes its rows,
// so that two of them never deadlock.
func batchArgs(n int, at func(i int) (key, token string, ttl time.Duration)) (errs []error, order []int, keys, tokens []string, us []int64) {
	errs = make([]error, n)
	for i := range n {
		key, _, ttl := at(i)
		if err := checkKey(key); err != nil {
			errs[i] = err
		} else if _, err := micros(ttl); err != nil {
			errs[i] = err
		} else {
			order = append(order, i)
		}
	}
	slices.SortFunc(order, func(a, b int) int {
		ka, _, _ := at(a)
		kb, _, _ := at(b)
		return strings.Compare(ka, kb)
	})
	keys, tokens, us = make([]string, len(order)), make([]string, len(order)), make([]int64, len(order))
	for j, i := range order {
		var ttl time.Duration
		keys[j], tokens[j], ttl = at(i)
		us[j] = ttl.Microseconds()
	}
	return errs, order, keys, tokens, us
}

// retryable reports a serialization failure or a deadlock: under REPEATABLE
// READ or SERIALIZABLE a concurrent change of the key's row fails the
// statement, which then runs again with a new snapshot.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

// maxRetries bounds the re-runs of a statement that failed to serialize.
const maxRetries = 20

// retry runs f again while it fails with a serialization failure, at most
// maxRetries times and while ctx lasts.
func retry(ctx context.Context, f func() error) error {
	err := f()
	for i := 0; i < maxRetries && retryable(err) && ctx.Err() == nil; i++ {
		err = f()
	}
	return err
}

func remaining(us int64) time.Duration { return max(time.Duration(us)*time.Microsecond, 0) }

// Acquire implements driver.Store: one call of the acquire function,
// which takes the key's advisory transaction lock and row, applies the
// queue rule and mints the fence only once the key is won.
func (s *Store) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := checkKey(req.Key); err != nil {
		return driver.Grant{}, err
	}
	if req.Token == "" { // a free row's token: the acquire would take it as its own
		return driver.Grant{}, fmt.Errorf("%w: pgstore: the token is empty", driver.ErrInvalidOptions)
	}
	us, err := micros(req.TTL)
	if err != nil {
		return driver.Grant{}, err
	}
	var qus, kus int64
	if req.QueueTTL > 0 {
		if qus, err = micros(req.QueueTTL); err != nil {
			return driver.Grant{}, err
		}
		if req.Kept > 0 && s.wakeChannel() != "" {
			kus = max(req.Kept.Microseconds(), 1)
		}
	}
	if s.free.has(req.Key) {
		if g, ok, err := s.acquireFast(ctx, req, us); ok {
			return g, err
		}
	}
	// Expect a wake-up for a waiting acquire before it is sent: a release
	// may notify this store of it before its answer is read.
	epoch, up := s.lis.queuedAt()
	if up && req.QueueTTL > 0 {
		s.lis.expect(req.Key, req.Token, epoch)
	}
	a, err := s.acquires.do(ctx, req.Key, req.Token, acquireCall{us: us, qus: qus, kus: kus, holder: req.Holder})
	won, fence, rem, holder, ahead := a.won, a.fence, a.remaining, a.seenHolder, a.ahead
	if won || err != nil { // an error: the next Acquire (or Release) decides
		s.lis.forget(req.Key, req.Token)
	}
	switch {
	case err != nil:
		return driver.Grant{}, storeErr("acquire", req.Key, err)
	case !won:
		return driver.Grant{Remaining: remaining(rem), Holder: holder, Ahead: int(ahead)}, driver.ErrNotAcquired
	case fence <= 0:
		return driver.Grant{}, storeErr("acquire", req.Key, fmt.Errorf("%w: fence %d", driver.ErrBadEntry, fence))
	}
	return driver.Grant{Fence: uint64(fence)}, nil
}

// acquireFast sends the fast acquire alone (one plain UPDATE of the key's
// free row). ok is false when it did not apply: the key is then forgotten
// as free and the caller sends the full acquire.
func (s *Store) acquireFast(ctx context.Context, req driver.AcquireRequest, us int64) (g driver.Grant, ok bool, err error) {
	var fence int64
	err = retry(ctx, func() error {
		return s.db.QueryRow(ctx, s.acquireFastSQL, req.Key, req.Token, us, req.Holder, s.opts.Durable).Scan(&fence)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		s.free.drop(req.Key)
		return driver.Grant{}, false, nil
	}
	if err != nil {
		return driver.Grant{}, true, storeErr("acquire", req.Key, err)
	}
	return driver.Grant{Fence: uint64(fence)}, true, nil
}

// Renew implements driver.Store: a token-checked UPDATE of expires_at.
func (s *Store) Renew(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := checkKey(key); err != nil {
		return err
	}
	us, err := micros(ttl)
	if err != nil {
		return err
	}
	var tag pgconn.CommandTag
	err = retry(ctx, func() (err error) {
		tag, err = s.db.Exec(ctx, s.renewSQL, key, token, us)
		return err
	})
	if err != nil {
		return storeErr("renew", key, err)
	}
	if tag.RowsAffected() == 0 {
		return driver.ErrNotOwned
	}
	return nil
}

// RenewBatch implements driver.BatchRenewer: every renewal in one UPDATE
// over unnest'ed arrays (sorted by key, as the batch acquires and releases
// take their rows, so that they never deadlock), one round trip. A key and
// token missing from its result were not owned.
func (s *Store) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []error {
	errs, order, keys, tokens, ttls := batchArgs(len(reqs), func(i int) (string, string, time.Duration) {
		return reqs[i].Key, reqs[i].Token, reqs[i].TTL
	})
	if len(order) == 0 {
		return errs
	}
	var renewed map[[2]string]bool
	err := retry(ctx, func() error {
		var err error
		renewed, err = s.renewBatch(ctx, keys, tokens, ttls)
		return err
	})
	for i, r := range reqs {
		switch {
		case errs[i] != nil:
		case err != nil:
			errs[i] = storeErr("renew", r.Key, err)
		case !renewed[[2]string{r.Key, r.Token}]:
			errs[i] = driver.ErrNotOwned
		}
	}
	return errs
}

func (s *Store) renewBatch(ctx context.Context, keys, tokens []string, ttls []int64) (map[[2]string]bool, error) {
	rows, err := s.db.Query(ctx, s.renewBatchSQL, keys, tokens, ttls)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	renewed := make(map[[2]string]bool, len(keys))
	for rows.Next() {
		var k, t string
		if err := rows.Scan(&k, &t); err != nil {
			return nil, err
		}
		renewed[[2]string{k, t}] = true
	}
	return renewed, rows.Err()
}

// Release implements driver.Store: one call of the release function,
// which deletes the token's lock, takes the token out of the queue and
// notifies the key's new queue head (only when there is one).
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	var (
		res  int32
		kept bool
		err  error
	)
	if s.free.has(key) {
		kept, err = s.releaseFast(ctx, key, token)
	}
	if !kept && err == nil {
		var r releaseCall
		r, err = s.releases.do(ctx, key, token, releaseCall{})
		res, kept = r.res, r.kept
	}
	if err == nil {
		s.lis.forget(key, token)
		s.free.set(key, kept)
		s.sweep.maybe(s)
	}
	switch {
	case err != nil:
		return storeErr("release", key, err)
	case res == 1:
		return driver.ErrNotOwned
	case res == 2:
		return driver.ErrNotHeld
	}
	return nil
}

// releaseFast sends the fast release alone (one plain UPDATE that keeps
// the key's row free). kept is false when it did not apply (someone waits
// for the key, or token does not hold it): the caller then sends the full
// release, which also tells which.
func (s *Store) releaseFast(ctx context.Context, key, token string) (kept bool, err error) {
	var tag pgconn.CommandTag
	err = retry(ctx, func() (err error) {
		tag, err = s.db.Exec(ctx, s.releaseFastSQL, key, token, s.opts.Durable)
		return err
	})
	return err == nil && tag.RowsAffected() == 1, err
}

// Inspect implements driver.Inspector. Facts hold the table, the channel
// and the acquisition and expiry times by the database clock (RFC 3339,
// UTC).
func (s *Store) Inspect(ctx context.Context, key string) (driver.LockInfo, error) {
	if err := checkKey(key); err != nil {
		return driver.LockInfo{}, err
	}
	infos, err := s.query(ctx, s.inspectSQL, key)
	if err != nil {
		return driver.LockInfo{}, storeErr("inspect", key, err)
	}
	if len(infos) == 0 {
		return driver.LockInfo{}, driver.ErrNotHeld
	}
	return infos[0], nil
}

// List implements driver.Inspector: the unexpired rows whose key starts
// with prefix (LIKE with % and _ escaped), in byte order (COLLATE "C"). Rows
// it cannot decode (an infinite expiry, a fence <= 0) are skipped and
// reported in an error wrapping driver.ErrBadEntry, with the good rows.
func (s *Store) List(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	infos, err := s.query(ctx, s.listSQL, likePrefix(prefix))
	if err != nil && !errors.Is(err, driver.ErrBadEntry) {
		return nil, storeErr("list", prefix, err)
	}
	return infos, err
}

// ForceRelease implements driver.ForceReleaser: it deletes key's lock
// whatever its token and wakes the queue's head. An expired lock is deleted
// too but reported as ErrNotHeld; a bad row (see List) is deleted and
// reported with an error wrapping driver.ErrBadEntry.
func (s *Store) ForceRelease(ctx context.Context, key string) (driver.LockInfo, error) {
	if err := checkKey(key); err != nil {
		return driver.LockInfo{}, err
	}
	var infos []driver.LockInfo
	err := retry(ctx, func() (err error) {
		infos, err = s.query(ctx, s.forceSQL, key, s.channel, s.opts.Durable)
		return err
	})
	switch {
	case err != nil && !errors.Is(err, driver.ErrBadEntry):
		return driver.LockInfo{}, storeErr("force release", key, err)
	case err != nil: // a bad row, deleted
		return driver.LockInfo{Key: key}, err
	case len(infos) == 0:
		return driver.LockInfo{}, driver.ErrNotHeld
	}
	return infos[0], nil
}

// query runs a statement returning lock rows (see buildSQL) and decodes
// them. Bad rows are skipped and named in an error wrapping
// driver.ErrBadEntry, returned with the good ones.
func (s *Store) query(ctx context.Context, sql string, args ...any) ([]driver.LockInfo, error) {
	rows, err := s.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var (
		out []driver.LockInfo
		bad []string
	)
	for rows.Next() {
		var (
			li                driver.LockInfo
			fence, nowUS      int64
			expires, acquired *int64
			waiting           int64
		)
		if err := rows.Scan(&li.Key, &li.Token, &li.Holder, &fence, &expires, &acquired, &nowUS, &waiting, &li.NextHolder); err != nil {
			return nil, err
		}
		if expires == nil || acquired == nil || fence <= 0 {
			bad = append(bad, fmt.Sprintf("%q", li.Key))
			continue
		}
		li.Fence = uint64(fence)
		li.Remaining = remaining(*expires - nowUS)
		li.Waiting = int(waiting)
		li.Facts = map[string]string{
			"table":       s.n.locks,
			"channel":     s.channel,
			"acquired_at": time.UnixMicro(*acquired).UTC().Format(time.RFC3339Nano),
			"expires_at":  time.UnixMicro(*expires).UTC().Format(time.RFC3339Nano),
		}
		out = append(out, li)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(bad) > 0 {
		return out, fmt.Errorf("%w: pgstore: %s: rows with an infinite time or a fence <= 0 for keys %s (delete them: leasehold release KEY --force)",
			driver.ErrBadEntry, s.n.locks, strings.Join(bad, ", "))
	}
	return out, nil
}

// likePrefix returns a LIKE pattern (ESCAPE '\') matching strings that start
// with prefix.
func likePrefix(prefix string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return r.Replace(prefix) + "%"
}

// Migrate creates the store's objects when they are missing, and upgrades
// those of an older version, in one transaction under an advisory lock (so
// replicas starting together do not race). New and Open call it as
// Options.Migrate says. It is idempotent.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.db.Exec(ctx, s.migrateSQL()); err != nil {
		return fmt.Errorf("pgstore: create or upgrade %s and its companions (or set Migrate: MigrateNever and run MigrationSQL yourself): %w", s.n.locks, classify(err))
	}
	return nil
}

// Close stops the LISTEN connection and waits for its goroutine, deletes the
// subscription rows its WaitRelease calls wrote, then closes the pool if
// Open created it. It releases no lock and leaves no queue: the Locker
// releases what it holds and takes its waiters out of their queues on its
// own Close, and a lock or queue entry nobody releases ends at its TTL by
// the database's clock. Later WaitRelease calls return ErrClosed; when the
// Store came from New, the other methods keep working. Close is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.lis.close()
		s.sweep.close()
		s.cleanUp()
		if s.ownedPool != nil {
			s.ownedPool.Close()
		}
	})
	return nil
}

// closeTimeout bounds the statements of Close and of a subscription's end.
const closeTimeout = 2 * time.Second

// cleanUp deletes the store's subscription rows. What it cannot delete (the
// database is out of reach) ends at its TTL.
func (s *Store) cleanUp() {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if keys, tokens := s.lis.takeRows(); len(keys) > 0 {
		if _, err := s.db.Exec(ctx, s.unsubscribeSQL, keys, tokens); err != nil {
			s.opts.Logger.Warn("pgstore: Close could not delete the store's subscriptions; they end at their TTL", "err", err)
		}
	}
}

// sweepEvery is how often, at most, a store deletes old free rows.
const sweepEvery = time.Minute

// sweeper deletes the free rows that the fast release keeps as fence state
// (empty token), once they are a minute old and their fence is a minute below
// the clock, so that one key per job does not pile up rows: the clock
// floor covers a deleted row's fence. A release starts it in the
// background at most once per sweepEvery; Close waits for it.
type sweeper struct {
	mu     sync.Mutex
	next   time.Time
	closed bool
	wg     sync.WaitGroup
}

func (w *sweeper) maybe(s *Store) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	if w.closed || now.Before(w.next) {
		return
	}
	w.next = now.Add(sweepEvery)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		if _, err := s.db.Exec(ctx, s.sweepSQL); err != nil {
			s.opts.Logger.Warn("pgstore: cannot delete old free lock rows; the next sweep retries", "err", err)
		}
	}()
}

// close stops new sweeps and waits for one in flight.
func (w *sweeper) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.wg.Wait()
}

// maxFreeKeys bounds the keys a store remembers as free; past it, it
// forgets them all (they are hints: a wrong one costs one round trip).
const maxFreeKeys = 4096

// freeKeys are the keys whose row the store's last release of them kept
// free (no waiters): their next acquire and release send the fast
// statement alone, a plain UPDATE, without the function call beside it.
// Any other key, or one whose fast statement did not apply, gets the full
// statement (the fast path or the function, in one round trip).
type freeKeys struct {
	mu   sync.Mutex
	keys map[string]struct{}
}

func (f *freeKeys) has(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.keys[key]
	return ok
}

func (f *freeKeys) set(key string, free bool) {
	if !free {
		f.drop(key)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.keys == nil || len(f.keys) >= maxFreeKeys {
		f.keys = map[string]struct{}{}
	}
	f.keys[key] = struct{}{}
}

func (f *freeKeys) drop(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.keys, key)
}

// newID returns 128 random bits in hex: the store's own id.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// RefreshQueue implements driver.QueueRefresher: every refresh in one UPDATE
// of the waiter table over unnest'ed arrays (sorted by key, as the batch
// releases take their rows), one round trip. A token missing from its
// result had no live queue entry.
func (s *Store) RefreshQueue(ctx context.Context, reqs []driver.QueueRefresh) []error {
	errs, order, keys, tokens, ttls := batchArgs(len(reqs), func(i int) (string, string, time.Duration) {
		return reqs[i].Key, reqs[i].Token, reqs[i].QueueTTL
	})
	if len(order) == 0 {
		return errs
	}
	kept := make([]int64, len(order))
	for j, i := range order {
		if k := reqs[i].Kept; k > 0 && s.wakeChannel() != "" {
			kept[j] = max(k.Microseconds(), 1)
		}
	}
	var held map[[2]string]bool
	err := retry(ctx, func() error {
		var err error
		held, err = s.refreshQueue(ctx, keys, tokens, ttls, kept)
		return err
	})
	for _, i := range order {
		r := reqs[i]
		h, queued := held[[2]string{r.Key, r.Token}]
		switch {
		case err != nil:
			errs[i] = storeErr("refresh", r.Key, err)
		case !queued:
			errs[i] = driver.ErrNotQueued
		case !h:
			errs[i] = driver.ErrNotHeld
		}
	}
	return errs
}

// refreshQueue runs refreshSQL and returns, for each (key, token) it
// refreshed, whether the key is held.
func (s *Store) refreshQueue(ctx context.Context, keys, tokens []string, ttls, kept []int64) (map[[2]string]bool, error) {
	rows, err := s.db.Query(ctx, s.refreshSQL, keys, tokens, ttls, kept)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	held := make(map[[2]string]bool, len(keys))
	for rows.Next() {
		var k, t string
		var h bool
		if err := rows.Scan(&k, &t, &h); err != nil {
			return nil, err
		}
		held[[2]string{k, t}] = h
	}
	return held, rows.Err()
}

// KeepPresence implements driver.PresenceKeeper: one upsert of the store's
// row in the presence table (keyed by its own NOTIFY channel, the wake of
// its queue entries) that makes it last ttl from now, never less; at most
// once a minute it also deletes up to 16 presences expired over an hour ago. The
// places its waiters queued or refreshed with Kept live until the earlier
// of their own deadline and the presence's. A store without a LISTEN
// connection (no Options.Listen) has no channel of its own, hence no
// presence: it returns an error wrapping errors.ErrUnsupported.
func (s *Store) KeepPresence(ctx context.Context, ttl time.Duration) error {
	wake := s.wakeChannel()
	if wake == "" {
		return fmt.Errorf("pgstore: a presence needs the store's LISTEN connection (Options.Listen): %w", errors.ErrUnsupported)
	}
	us, err := micros(ttl)
	if err != nil {
		return err
	}
	now := time.Now().UnixNano()
	next := s.presenceSweep.Load()
	sweep := now >= next && s.presenceSweep.CompareAndSwap(next, now+int64(sweepEvery))
	err = retry(ctx, func() error {
		_, err := s.db.Exec(ctx, s.presenceSQL, wake, us, sweep)
		return err
	})
	if err != nil {
		if sweep {
			s.presenceSweep.Store(0) // the next keeping sweeps
		}
		return storeErr("keep presence", wake, err)
	}
	return nil
}
