package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasehold/leasehold/driver"
)

var (
	_ driver.Semaphorer     = (*Store)(nil)
	_ driver.PermitNotifier = (*Store)(nil)
)

// permitWakeKey is the NOTIFY payload of a permit release: "\x01permit:KEY"
// (no lock key has a control character, so it never wakes a lock's waiter).
func permitWakeKey(key string) string { return "\x01permit:" + key }

// WaitPermit implements driver.PermitNotifier over the store's LISTEN
// connection (see WaitRelease). A permit release notifies, by token, only the
// waiters whose turn came: the first F live waiters of the queue, F the
// permits free afterwards (none while the count is at or over a lowered
// limit); a waiter among those F leaving passes its turn on the same way.
// With an empty queue a freed permit wakes every subscriber of key. Expiry
// sends no notification.
func (s *Store) WaitPermit(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	if err := checkKey(key); err != nil {
		return nil, nil, err
	}
	return s.WaitRelease(ctx, permitWakeKey(key), token)
}

// semNames are the quoted, schema-qualified names of the semaphore objects
// beside a lock table T: T_permits (one row per live permit), T_permit_queue
// (waiters), T_permit_limits (one row per busy semaphore: the last limit,
// and the row every acquire of the key locks), and the functions
// T_acquire_permit and T_release_permit.
type semNames struct {
	permits, queue, limits, acquire, release string
}

func newSemNames(schema, table string) semNames {
	q := func(suffix string) string { return pgx.Identifier{schema, table + suffix}.Sanitize() }
	return semNames{
		permits: q("_permits"), queue: q("_permit_queue"), limits: q("_permit_limits"),
		acquire: q("_acquire_permit"), release: q("_release_permit"),
	}
}

// SemaphoreMigrationSQL returns the DDL of the semaphore tables and functions
// beside a lock table (CREATE ... IF NOT EXISTS, CREATE OR REPLACE FUNCTION),
// for running by hand after MigrationSQL. Empty arguments mean the defaults.
// The names are the table's with the suffixes _permits, _permit_queue,
// _permit_limits, _acquire_permit and _release_permit; keep the table name
// short enough for them (63 bytes).
func SemaphoreMigrationSQL(schema, table string) string {
	if schema == "" {
		schema = DefaultSchema
	}
	if table == "" {
		table = DefaultTable
	}
	n := newSemNames(schema, table)
	r := strings.NewReplacer("$P", n.permits, "$Q", n.queue, "$L", n.limits, "$ACQ", n.acquire, "$REL", n.release)
	return r.Replace(semDDL)
}

// semDDL: every time is the database clock, read once after the key's limits
// row is locked, so one acquire of a key runs at a time and its count of
// holders is exact. The fence is minted under that lock from the row's
// last_fence: max(last + 1, clock in µs). The row is deleted when the
// semaphore is empty and the clock alone is above its last fence, so fences
// never go backward unless the database clock steps back while the row is
// gone. Queue order is a per-key sequence that also never goes backward.
const semDDL = `CREATE TABLE IF NOT EXISTS $L (
	key text COLLATE "C" PRIMARY KEY,
	lim integer NOT NULL,
	last_fence bigint NOT NULL DEFAULT 0
);
ALTER TABLE $L ADD COLUMN IF NOT EXISTS last_fence bigint NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS $P (
	key         text COLLATE "C" NOT NULL,
	token       text        NOT NULL,
	holder      text        NOT NULL,
	fence       bigint      NOT NULL,
	acquired_at timestamptz NOT NULL,
	expires_at  timestamptz NOT NULL,
	PRIMARY KEY (key, token)
);
CREATE TABLE IF NOT EXISTS $Q (
	key      text COLLATE "C" NOT NULL,
	token    text        NOT NULL,
	holder   text        NOT NULL,
	seq      bigint      NOT NULL,
	deadline timestamptz NOT NULL,
	PRIMARY KEY (key, token)
);
CREATE OR REPLACE FUNCTION $ACQ(p_key text, p_token text, p_ttl_us bigint, p_limit integer,
	p_qttl_us bigint, p_holder text)
RETURNS TABLE (ok boolean, fence bigint, remaining_us bigint, ahead integer, holder text)
LANGUAGE plpgsql AS $fn$
DECLARE
	ts timestamptz;
	n integer;
	pos integer;
	myseq bigint;
	f bigint;
BEGIN
	INSERT INTO $L AS m (key, lim) VALUES (p_key, p_limit)
		ON CONFLICT (key) DO UPDATE SET lim = EXCLUDED.lim;
	ts := clock_timestamp();
	DELETE FROM $P p WHERE p.key = p_key AND p.expires_at <= ts;
	DELETE FROM $Q q WHERE q.key = p_key AND q.deadline <= ts;
	UPDATE $P p SET expires_at = ts + p_ttl_us * interval '1 microsecond'
		WHERE p.key = p_key AND p.token = p_token RETURNING p.fence INTO f;
	IF FOUND THEN -- our own retry after a lost reply: same fence
		DELETE FROM $Q q WHERE q.key = p_key AND q.token = p_token;
		RETURN QUERY SELECT true, f, 0::bigint, 0, ''::text;
		RETURN;
	END IF;
	SELECT count(*) INTO n FROM $P p WHERE p.key = p_key;
	SELECT q.seq INTO myseq FROM $Q q WHERE q.key = p_key AND q.token = p_token;
	SELECT count(*) INTO pos FROM $Q q WHERE q.key = p_key AND (myseq IS NULL OR q.seq < myseq);
	IF pos < p_limit - n THEN
		UPDATE $L m SET last_fence = GREATEST(m.last_fence + 1, (extract(epoch FROM ts) * 1000000)::bigint)
			WHERE m.key = p_key RETURNING m.last_fence INTO f;
		INSERT INTO $P (key, token, holder, fence, acquired_at, expires_at)
			VALUES (p_key, p_token, p_holder, f, ts, ts + p_ttl_us * interval '1 microsecond');
		DELETE FROM $Q q WHERE q.key = p_key AND q.token = p_token;
		RETURN QUERY SELECT true, f, 0::bigint, 0, ''::text;
		RETURN;
	END IF;
	IF p_qttl_us > 0 THEN
		INSERT INTO $Q AS q (key, token, holder, seq, deadline)
			VALUES (p_key, p_token, p_holder,
				(SELECT GREATEST(COALESCE(max(q2.seq), 0) + 1, (extract(epoch FROM ts) * 1000000)::bigint) FROM $Q q2 WHERE q2.key = p_key),
				ts + p_qttl_us * interval '1 microsecond')
			ON CONFLICT (key, token) DO UPDATE SET deadline = EXCLUDED.deadline;
	END IF;
	IF n >= p_limit THEN
		RETURN QUERY SELECT false, 0::bigint,
			(extract(epoch FROM (p.expires_at - ts)) * 1000000)::bigint, pos, p.holder
			FROM $P p WHERE p.key = p_key ORDER BY p.expires_at LIMIT 1;
	ELSE
		RETURN QUERY SELECT false, 0::bigint, 0::bigint, pos, ''::text;
	END IF;
END
$fn$;
CREATE OR REPLACE FUNCTION $REL(p_key text, p_token text, p_channel text)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
	ts timestamptz;
	lim_ integer;
	n integer;
	held boolean;
	myseq bigint;
	pos integer;
	w text;
	wake_key text := chr(1) || 'permit:' || p_key;
BEGIN
	SELECT m.lim INTO lim_ FROM $L m WHERE m.key = p_key FOR UPDATE;
	ts := clock_timestamp();
	DELETE FROM $P p WHERE p.key = p_key AND p.expires_at <= ts;
	SELECT count(*) INTO n FROM $P p WHERE p.key = p_key;
	DELETE FROM $P p WHERE p.key = p_key AND p.token = p_token;
	held := FOUND;
	DELETE FROM $Q q WHERE q.key = p_key AND q.token = p_token AND q.deadline > ts RETURNING q.seq INTO myseq;
	IF myseq IS NOT NULL THEN
		SELECT count(*) INTO pos FROM $Q q WHERE q.key = p_key AND q.deadline > ts AND q.seq < myseq;
	END IF;
	DELETE FROM $Q q WHERE q.key = p_key AND q.token = p_token;
	-- The row keeps the last fence: it goes only when the clock floor alone
	-- keeps the next fence above it.
	DELETE FROM $L m WHERE m.key = p_key
		AND m.last_fence < (extract(epoch FROM ts) * 1000000)::bigint
		AND NOT EXISTS (SELECT 1 FROM $P p WHERE p.key = p_key)
		AND NOT EXISTS (SELECT 1 FROM $Q q WHERE q.key = p_key AND q.deadline > ts);
	-- Wake only the waiters whose turn came: the first F live waiters, F the
	-- permits free now, when a permit was freed or a waiter among the first
	-- F before this call left. With an empty queue a freed permit wakes
	-- every subscriber of the key; with no limit row, every waiter.
	IF NOT held AND NOT (myseq IS NOT NULL AND pos < COALESCE(lim_, 0) - n) THEN
		RETURN held;
	END IF;
	IF held THEN
		n := n - 1;
	END IF;
	IF lim_ IS NULL OR (held AND NOT EXISTS (SELECT 1 FROM $Q q WHERE q.key = p_key AND q.deadline > ts)) THEN
		PERFORM pg_notify(p_channel, '*:' || wake_key);
		RETURN held;
	END IF;
	FOR w IN SELECT q.token FROM $Q q WHERE q.key = p_key AND q.deadline > ts
			ORDER BY q.seq LIMIT GREATEST(lim_ - n, 0) LOOP
		PERFORM pg_notify(p_channel, octet_length(w) || ':' || w || wake_key);
	END LOOP;
	RETURN held;
END
$fn$;
`

func (s *Store) semNames() semNames { return newSemNames(s.opts.Schema, s.opts.Table) }

// AcquirePermit implements driver.Semaphorer: one call of the
// T_acquire_permit function, which locks the key's limits row, prunes
// expired holders and waiters, applies the queue rule and mints the fence
// from the row (see SemaphoreMigrationSQL).
func (s *Store) AcquirePermit(ctx context.Context, req driver.PermitRequest) (driver.Grant, error) {
	if err := checkKey(req.Key); err != nil {
		return driver.Grant{}, err
	}
	us, err := micros(req.TTL)
	if err != nil {
		return driver.Grant{}, err
	}
	if req.Limit < 1 {
		return driver.Grant{}, fmt.Errorf("%w: pgstore: permit limit must be at least 1, got %d", driver.ErrInvalidOptions, req.Limit)
	}
	qus := max(req.QueueTTL.Microseconds(), 0)
	var (
		ok     bool
		fence  int64
		rem    int64
		ahead  int32
		holder string
	)
	q := `SELECT * FROM ` + s.semNames().acquire + `($1, $2, $3, $4, $5, $6)`
	err = s.db.QueryRow(ctx, q, req.Key, req.Token, us, req.Limit, qus, req.Holder).
		Scan(&ok, &fence, &rem, &ahead, &holder)
	switch {
	case err != nil:
		return driver.Grant{}, storeErr("acquire permit", req.Key, semErr(err))
	case !ok:
		return driver.Grant{Remaining: remaining(rem), Ahead: int(ahead), Holder: holder}, driver.ErrNotAcquired
	case fence <= 0:
		return driver.Grant{}, storeErr("acquire permit", req.Key, fmt.Errorf("minted fence %d", fence))
	}
	return driver.Grant{Fence: uint64(fence)}, nil
}

// semErr marks a missing semaphore table or function (the migration was not
// run) as a configuration error.
func semErr(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "42883") { // undefined table, function
		return fmt.Errorf("%w: %w (run SemaphoreMigrationSQL, or Open with MigrateCreate)", driver.ErrMisconfigured, err)
	}
	return err
}

// RenewPermit implements driver.Semaphorer: a token-checked UPDATE.
func (s *Store) RenewPermit(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := checkKey(key); err != nil {
		return err
	}
	us, err := micros(ttl)
	if err != nil {
		return err
	}
	tag, err := s.db.Exec(ctx, `UPDATE `+s.semNames().permits+`
SET expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond'
WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp()`, key, token, us)
	switch {
	case err != nil:
		return storeErr("renew permit", key, semErr(err))
	case tag.RowsAffected() != 1:
		return driver.ErrNotOwned
	}
	return nil
}

// ReleasePermit implements driver.Semaphorer: one call of the
// T_release_permit function, which also NOTIFYs on Channel (see WaitPermit).
func (s *Store) ReleasePermit(ctx context.Context, key, token string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	var held bool
	err := s.db.QueryRow(ctx, `SELECT `+s.semNames().release+`($1, $2, $3)`, key, token, s.channel).Scan(&held)
	switch {
	case err != nil:
		return storeErr("release permit", key, semErr(err))
	case !held:
		return driver.ErrNotHeld
	}
	return nil
}

// Permits implements driver.Semaphorer in one statement.
func (s *Store) Permits(ctx context.Context, key string) (driver.PermitInfo, error) {
	if err := checkKey(key); err != nil {
		return driver.PermitInfo{}, err
	}
	n := s.semNames()
	rows, err := s.db.Query(ctx, `WITH now AS (SELECT clock_timestamp() AS ts)
SELECT (SELECT lim FROM `+n.limits+` WHERE key = $1),
	(SELECT count(*) FROM `+n.queue+`, now WHERE key = $1 AND deadline > now.ts),
	(SELECT holder FROM `+n.queue+`, now WHERE key = $1 AND deadline > now.ts ORDER BY seq LIMIT 1),
	p.token, p.holder, p.fence, (extract(epoch FROM (p.expires_at - now.ts)) * 1000000)::bigint, p.acquired_at
FROM now LEFT JOIN `+n.permits+` p ON p.key = $1 AND p.expires_at > now.ts
ORDER BY p.fence`, key)
	if err != nil {
		return driver.PermitInfo{}, storeErr("permits", key, semErr(err))
	}
	defer rows.Close()
	info := driver.PermitInfo{Key: key}
	for rows.Next() {
		var (
			lim                 *int32
			waiting             int64
			head, token, holder *string
			fence, rem          *int64
			acquired            *time.Time
		)
		if err := rows.Scan(&lim, &waiting, &head, &token, &holder, &fence, &rem, &acquired); err != nil {
			return driver.PermitInfo{}, storeErr("permits", key, err)
		}
		if lim != nil {
			info.Limit = int(*lim)
		}
		info.Waiting = int(waiting)
		if head != nil {
			info.NextHolder = *head
		}
		if token == nil {
			continue
		}
		info.Holders = append(info.Holders, driver.LockInfo{
			Key: key, Token: *token, Holder: *holder, Fence: uint64(*fence), Remaining: remaining(*rem),
			Facts: map[string]string{"store": "postgres", "table": n.permits, "acquired": acquired.UTC().Format(time.RFC3339Nano)},
		})
	}
	if err := rows.Err(); err != nil {
		return driver.PermitInfo{}, storeErr("permits", key, semErr(err))
	}
	return info, nil
}
