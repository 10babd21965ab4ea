package pgstore

import (
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// names are the quoted, schema-qualified names of the store's objects.
type names struct {
	schema, table string // raw
	locks         string // the lock table: one row per held (or expired) lock
	waiters       string // the waiter queue and the subscribers of each key
	counter       string // one row: the durable fence floor
	presence      string // one row per Store that keeps a presence (driver.PresenceKeeper)
	acquire       string // functions
	acquire2      string
	acquire3      string
	acquire4      string
	release       string
	release2      string
	release3      string
	force         string
	subscribe     string
	lockClass     int32 // advisory lock class of the per-key transaction locks
}

// suffixes of the objects derived from Options.Table.
const (
	sufWaiters = "_waiters"
	sufCounter = "_counter"
	sufAcquire = "_acquire"
	// sufAcquire2 is the acquire function with the waiter's wake channel: a
	// new name, not a new signature of the old one, so that an older
	// version's migration (CREATE OR REPLACE of the 7-argument function)
	// never makes a call ambiguous during a rolling upgrade.
	sufAcquire2 = "_acquire2"
	// sufAcquire3 and sufRelease2 keep the lock row's waited flag (see the
	// migration): new names again, so that an older version's migration,
	// which re-creates the functions it knows, never replaces their bodies
	// with ones that do not.
	sufAcquire3 = "_acquire3"
	// sufAcquire4 and sufRelease3 know the places kept by a presence (see
	// the migration): an older version's functions would count a kept
	// place whose presence ended as live until its own deadline.
	sufAcquire4  = "_acquire4"
	sufRelease   = "_release"
	sufRelease2  = "_release2"
	sufRelease3  = "_release3"
	sufPresence  = "_presence"
	sufForce     = "_force_release"
	sufSubscribe = "_subscribe" // a WaitRelease subscription, under the key's advisory lock
	longestSuf   = sufForce
)

func newNames(schema, table string) names {
	q := func(suffix string) string { return pgx.Identifier{schema, table + suffix}.Sanitize() }
	h := fnv.New32a()
	h.Write([]byte("leasehold.pgstore:" + schema + "." + table))
	return names{
		schema: schema, table: table,
		locks: q(""), waiters: q(sufWaiters), counter: q(sufCounter), presence: q(sufPresence),
		acquire: q(sufAcquire), acquire2: q(sufAcquire2), acquire3: q(sufAcquire3), acquire4: q(sufAcquire4),
		release: q(sufRelease), release2: q(sufRelease2), release3: q(sufRelease3), force: q(sufForce),
		subscribe: q(sufSubscribe),
		lockClass: int32(h.Sum32()),
	}
}

// Expressions every statement uses. Times come from the database clock
// (clock_timestamp()); µs since the epoch are bigint.
const (
	nowUS = `(extract(epoch FROM clock_timestamp()) * 1000000)::bigint`
	// usOf is a timestamp in µs, NULL when it is not finite (a bad entry).
	usOf = `CASE WHEN isfinite(%[1]s) THEN (extract(epoch FROM %[1]s) * 1000000)::bigint END`
)

// until is the deadline of waiter row w (an alias): its expires_at, and for
// a place kept by its store's presence (kept) no later than the presence's
// end (-infinity when the presence is gone). A row is live while its
// deadline is ahead of the clock (see live); a subscription row is never
// kept.
func until(presence, w string) string {
	return `CASE WHEN ` + w + `.kept THEN LEAST(` + w + `.expires_at, coalesce((SELECT p.expires_at FROM ` + presence +
		` p WHERE p.wake = ` + w + `.wake), '-infinity')) ELSE ` + w + `.expires_at END`
}

// live is the condition that waiter row w is live at now.
func live(presence, w, now string) string { return `(` + until(presence, w) + `) > ` + now }

// buildSQL renders the statements once, with the quoted names spliced in;
// every value is a parameter.
func (s *Store) buildSQL() {
	n := s.n
	// The fast acquire ($1 key, $2 token, $3 TTL µs, $4 holder, $5
	// durable): one plain UPDATE of a free row nobody waits for (a key
	// released by the fast release keeps its row as fence state), a HOT
	// update with no function call. It applies only when the fence it mints
	// is not ahead of the clock (the row's fence and the floor are below
	// it), so it never needs to raise the floor: the acquire function does
	// that. The row lock orders it after every other grant of the key
	// (each one updates this row), and a concurrent update re-evaluates it
	// on the new row, clock included.
	fast := func(durable, keyLock string) string {
		return `UPDATE ` + n.locks + ` l SET token = $2, holder = $4,
		fence = GREATEST(l.fence + 1, ` + nowUS + `, (SELECT k.v FROM ` + n.counter + ` k) + 1),
		expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond', acquired_at = clock_timestamp()
	WHERE ` + keyLock + `l.key = $1 AND NOT l.waited AND l.expires_at <= clock_timestamp() AND l.token <> $2
		AND isfinite(l.expires_at) AND isfinite(l.acquired_at) AND l.fence > 0
		AND GREATEST(l.fence, (SELECT k.v FROM ` + n.counter + ` k)) < ` + nowUS + `
		AND (` + durable + ` OR set_config('synchronous_commit', 'off', true) IS NOT NULL)
	RETURNING l.fence`
	}
	s.acquireFastSQL = fast("$5::boolean", "")
	// Acquire ($1 key, $2 token, $3 TTL µs, $4 holder, $5 queue TTL µs, $6
	// durable, $7 channel, $8 wake channel, $9 kept µs) in one statement:
	// the fast acquire, or the acquire function when it did not apply (a new
	// key, a held key, a queue, a bad row, a fence ahead of the clock).
	//
	// Here the fast UPDATE takes the key's advisory lock before it reads the
	// row (a one-time filter, evaluated before the scan), as the function
	// does: an UPDATE that waited for the row and found it no longer free
	// (READ COMMITTED re-checks the newest version) keeps the row locked,
	// and the function then waits for the advisory lock. Row then advisory
	// lock, against the function's advisory lock then row, deadlocked:
	// every statement on the row, the holder's release included, waited
	// for the deadlock check (deadlock_timeout), again for each new cycle,
	// and a release held up past the TTL found the key taken.
	keyLock := fmt.Sprintf(`(SELECT true FROM pg_advisory_xact_lock(%d, hashtext($1))) AND `, n.lockClass)
	s.acquireSQL = `WITH u AS (` + fast("$6::boolean", keyLock) + `)
SELECT true, u.fence, 0::bigint, ''::text, 0 FROM u
UNION ALL
SELECT a.won, a.fence, a.remaining_us, a.holder, a.ahead FROM ` + n.acquire4 + `($1, $2, $3, $4, $5, $6, $7, $8, $9) a
WHERE NOT EXISTS (SELECT 1 FROM u)`
	// Many acquires ($1 keys, $2 tokens, $3 TTLs µs, $4 holders, $5 queue
	// TTLs µs, $9 kept µs as arrays; $6 durable, $7 channel, $8 wake
	// channel) in one statement, each through the acquire function, in the
	// arrays' order; it returns arrays of their results, in order. It
	// commits durably, as releaseBatchSQL does (see there).
	s.acquireBatchSQL = `SELECT CASE WHEN set_config('synchronous_commit', 'on', true) IS NOT NULL THEN r.won END, r.fence, r.rem, r.holder, r.ahead
FROM (SELECT array_agg(a.won ORDER BY x.i) AS won, array_agg(a.fence ORDER BY x.i) AS fence, array_agg(a.remaining_us ORDER BY x.i) AS rem,
		array_agg(a.holder ORDER BY x.i) AS holder, array_agg(a.ahead ORDER BY x.i) AS ahead
	FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $9::bigint[]) WITH ORDINALITY AS x(key, token, us, holder, qus, kus, i)
	CROSS JOIN LATERAL ` + n.acquire4 + `(x.key, x.token, x.us, x.holder, x.qus, $6, $7, $8, x.kus) a) r`
	// The fast release ($1 key, $2 token, $3 durable): one plain UPDATE
	// that keeps the row, with its fence, as a free row (token and holder
	// '', expired) when nobody waits for the key. waited is read from the
	// row after its lock: an enqueuer sets it under that lock. Release ($1
	// key, $2 token, $3 channel, $4 durable) in one statement: the fast
	// release, or the release function when it did not apply; the second
	// column says whether the fast release applied (the row was kept). It
	// takes the key's advisory lock first, as the release function and the
	// acquire do (advisory lock, then row: see acquireSQL).
	s.releaseFastSQL = `UPDATE ` + n.locks + ` l SET token = '', holder = '', expires_at = clock_timestamp()
	WHERE l.key = $1 AND l.token = $2 AND NOT l.waited AND l.expires_at > clock_timestamp()
		AND ($3::boolean OR set_config('synchronous_commit', 'off', true) IS NOT NULL)`
	s.releaseSQL = `WITH u AS (` + strings.Replace(strings.ReplaceAll(s.releaseFastSQL, "$3::boolean", "$4::boolean"), "WHERE l.key = $1", "WHERE "+keyLock+"l.key = $1", 1) + `
	RETURNING 0 AS res
)
SELECT res, true FROM u
UNION ALL
SELECT ` + n.release3 + `($1, $2, $3, $4), false WHERE NOT EXISTS (SELECT 1 FROM u)`
	// Free rows older than a minute whose fence is below the clock by as
	// much: the clock floor covers them (see sweeper).
	s.sweepSQL = `DELETE FROM ` + n.locks + ` WHERE token = '' AND NOT waited
	AND expires_at < clock_timestamp() - interval '1 minute' AND fence < ` + nowUS + ` - 60000000
	AND set_config('synchronous_commit', 'off', true) IS NOT NULL`
	// Many releases ($1 keys, $2 tokens, $3 channel, $4 durable) in one
	// statement, each through the release function, in the arrays' order
	// (sorted by key, so that two batches take the keys' advisory locks in
	// one order); it returns their results, in order. The transaction
	// commits durably: a call that must (its fence is ahead of the clock)
	// turns synchronous_commit on, but a later one turns it off again, so it
	// is set after the last call (in the outer select, which reads the
	// aggregate's result).
	s.releaseBatchSQL = `SELECT CASE WHEN set_config('synchronous_commit', 'on', true) IS NOT NULL THEN r.res END
FROM (SELECT array_agg(` + n.release3 + `(x.key, x.token, $3, $4) ORDER BY x.i) AS res
	FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS x(key, token, i)) r`
	// The end of WaitRelease subscriptions ($1 keys, $2 row tokens); a row
	// that became a queue entry stays.
	s.unsubscribeSQL = `DELETE FROM ` + n.waiters + ` w USING unnest($1::text[], $2::text[]) AS x(key, token)
WHERE w.key = x.key AND w.token = x.token AND NOT w.queued`
	// A subscription ($1 key, $2 row token, $3 TTL µs): see {subscribe}.
	s.subscribeSQL = `SELECT ` + n.subscribe + `($1, $2, $3)`
	// (A subscription never extends a queue entry: the entry's deadline is
	// the waiter's queue TTL, so a dead waiter leaves the queue in time.)

	// Renewals are durable commits (see README.md, "Durability").
	s.renewSQL = `UPDATE ` + n.locks + ` SET expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond'
WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp()`
	// Many renewals in one statement: $1 keys, $2 tokens, $3 TTLs in µs,
	// as arrays; it returns the (key, token) of each lock it renewed.
	s.renewBatchSQL = `UPDATE ` + n.locks + ` AS l SET expires_at = clock_timestamp() + r.us * interval '1 microsecond'
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(key, token, us)
WHERE l.key = r.key AND l.token = r.token AND l.expires_at > clock_timestamp()
RETURNING l.key, l.token`
	// Many queue refreshes ($1 keys, $2 tokens, $3 queue TTLs µs, $4 kept
	// µs, as arrays): each live queue entry's deadline moves to now + its
	// queue TTL, or with a kept µs > 0 to now + that, the entry kept by its
	// store's presence from then on (never back, never unkept); it returns
	// the (key, token) of each refreshed entry and whether its key is held.
	// A lost refresh costs nothing to undo, so it never waits for a durable
	// commit.
	s.refreshSQL = `UPDATE ` + n.waiters + ` AS w
SET expires_at = GREATEST(w.expires_at, clock_timestamp() + CASE WHEN r.kus > 0 AND w.wake <> '' THEN r.kus ELSE r.us END * interval '1 microsecond'),
	kept = w.kept OR (r.kus > 0 AND w.wake <> '')
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS r(key, token, us, kus)
WHERE w.key = r.key AND w.token = r.token AND w.queued AND ` + live(n.presence, "w", "clock_timestamp()") + `
	AND set_config('synchronous_commit', 'off', true) IS NOT NULL
RETURNING w.key, w.token, EXISTS (SELECT 1 FROM ` + n.locks + ` l WHERE l.key = w.key AND l.expires_at > clock_timestamp())`

	// Rows of (key, token, holder, fence, expires µs, acquired µs, now µs,
	// waiting, next holder); times NULL when not finite.
	cols := `l.key, l.token, l.holder, l.fence, ` + fmt.Sprintf(usOf, "l.expires_at") + `, ` +
		fmt.Sprintf(usOf, "l.acquired_at") + `, ` + nowUS + `,
	(SELECT count(*) FROM ` + n.waiters + ` w WHERE w.key = l.key AND w.queued AND ` + live(n.presence, "w", "clock_timestamp()") + `),
	coalesce((SELECT w.holder FROM ` + n.waiters + ` w WHERE w.key = l.key AND w.queued AND ` + live(n.presence, "w", "clock_timestamp()") + `
		ORDER BY w.enqueued_at, w.token LIMIT 1), '')`
	s.inspectSQL = `SELECT ` + cols + ` FROM ` + n.locks + ` l WHERE l.key = $1 AND l.expires_at > clock_timestamp()`
	s.listSQL = `SELECT ` + cols + ` FROM ` + n.locks + ` l
WHERE l.key LIKE $1 ESCAPE E'\\' AND l.expires_at > clock_timestamp()
ORDER BY l.key COLLATE "C"`
	// The presence ($1 wake channel, $2 TTL µs) lasts TTL from now, never
	// less; with $3, presences gone for an hour (their stores' places died
	// with them, a waiting acquire would re-create them) are deleted, a few
	// at a time. A lost keeping costs one more, so it never waits for a
	// durable commit.
	s.presenceSQL = `WITH gone AS (DELETE FROM ` + n.presence + ` p WHERE p.wake IN (SELECT g.wake FROM ` + n.presence + ` g
		WHERE $3::boolean AND g.expires_at < clock_timestamp() - interval '1 hour' AND g.wake <> $1 LIMIT 16))
INSERT INTO ` + n.presence + ` AS p (wake, expires_at)
SELECT $1, clock_timestamp() + $2::bigint * interval '1 microsecond' WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL
ON CONFLICT (wake) DO UPDATE SET expires_at = GREATEST(p.expires_at, EXCLUDED.expires_at)`
	s.forceSQL = `SELECT key, token, holder, fence, ` + fmt.Sprintf(usOf, "expires_at") + `, ` +
		fmt.Sprintf(usOf, "acquired_at") + `, now_us, 0::bigint, ''::text FROM ` + n.force + `($1, $2, $3)`
}

// migrateSQL creates or upgrades the store's objects, in one implicit
// transaction (one simple-protocol string) under a transaction-level
// advisory lock, so replicas starting together do not collide.
func (s *Store) migrateSQL() string {
	h := fnv.New64a()
	h.Write([]byte("leasehold.pgstore.migrate:" + s.n.locks))
	return fmt.Sprintf("SELECT pg_advisory_xact_lock(%d);\n", int64(h.Sum64())) +
		MigrationSQL(s.opts) + SemaphoreMigrationSQL(s.opts.Schema, s.opts.Table)
}

// MigrationSQL returns the DDL that creates the store's objects for opts
// (Schema, Table, Durable) when they are missing and upgrades those of older
// versions, for running by hand or from a migration tool: the lock, waiter
// and presence tables (UNLOGGED unless opts.Durable), the fence floor counter
// (always logged) and four functions (acquire, release, force release,
// subscribe). It is idempotent and never changes the persistence of an
// existing table (ALTER TABLE ... SET LOGGED or SET UNLOGGED does that).
func MigrationSQL(opts Options) string {
	schema, table := opts.Schema, opts.Table
	if schema == "" {
		schema = DefaultSchema
	}
	if table == "" {
		table = DefaultTable
	}
	n := newNames(schema, table)
	oldSeq := pgx.Identifier{schema, table + "_fence"}.Sanitize()
	unlogged := "UNLOGGED "
	if opts.Durable {
		unlogged = ""
	}
	r := strings.NewReplacer(
		"{locks}", n.locks, "{waiters}", n.waiters, "{counter}", n.counter, "{presence}", n.presence,
		"{acquire}", n.acquire, "{acquire2}", n.acquire2, "{acquire3}", n.acquire3, "{acquire4}", n.acquire4,
		"{release}", n.release, "{release2}", n.release2, "{release3}", n.release3, "{force}", n.force, "{subscribe}", n.subscribe,
		"{live:w}", live(n.presence, "w", "now_ts"), "{until:w}", until(n.presence, "w"),
		"{class}", fmt.Sprint(n.lockClass), "{oldseq}", quoteLiteral(oldSeq), "{unlogged}", unlogged,
	)
	return r.Replace(migrationTemplate)
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// migrationTemplate is the DDL; {names} are replaced by quoted identifiers.
//
// Fences: a grant takes GREATEST(row fence + 1, database clock µs, floor +
// 1) while it holds the key's advisory transaction lock and the row, so no
// fence is minted before the key is won. A row is deleted when its lock is
// released; a fence not below the clock at that moment is first recorded in
// the floor, so the next grant (from the clock or the floor) is larger. A
// grant whose fence is ahead of the clock (the clock stepped back) raises
// the floor and commits durably, so losing the lock rows (an UNLOGGED table
// after a crash) never repeats it; the others commit with synchronous_commit
// off (unless p_durable), because the clock floor covers their loss.
const migrationTemplate = `CREATE {unlogged}TABLE IF NOT EXISTS {locks} (
	key         text COLLATE "C" PRIMARY KEY,
	token       text        NOT NULL,
	fence       bigint      NOT NULL,
	expires_at  timestamptz NOT NULL,
	acquired_at timestamptz NOT NULL
);
ALTER TABLE {locks} ADD COLUMN IF NOT EXISTS holder text NOT NULL DEFAULT '';
-- waited: the key may have queue entries or subscriptions, so its releases
-- and acquires go through the functions; false lets the plain-statement
-- fast paths run. Set under the row's lock by every enqueue and
-- subscription; rows written by older versions get true.
ALTER TABLE {locks} ADD COLUMN IF NOT EXISTS waited boolean NOT NULL DEFAULT true;
CREATE {unlogged}TABLE IF NOT EXISTS {waiters} (
	key         text COLLATE "C" NOT NULL,
	token       text        NOT NULL,
	holder      text        NOT NULL DEFAULT '',
	queued      boolean     NOT NULL,
	enqueued_at timestamptz NOT NULL,
	expires_at  timestamptz NOT NULL,
	PRIMARY KEY (key, token)
);
ALTER TABLE {waiters} ADD COLUMN IF NOT EXISTS ttl_us bigint NOT NULL DEFAULT 0; -- the TTL a queued waiter asked for: a release grants it
ALTER TABLE {waiters} ADD COLUMN IF NOT EXISTS wake text NOT NULL DEFAULT ''; -- the waiter's store's own NOTIFY channel ('': the shared one)
-- Every waiter's row is updated once per refresh interval (RefreshQueue):
-- room on its page keeps those updates HOT (no new index entry); at the
-- default fillfactor 4 % of them were, and a refresh took 40 % longer.
ALTER TABLE {waiters} SET (fillfactor = 50);
-- kept: the place is kept by its store's presence (driver.PresenceKeeper),
-- the {presence} row of its wake: it lives until the earlier of expires_at
-- and the presence's expires_at ({until:w} in the functions). A place once
-- kept stays kept (only a queued row is).
ALTER TABLE {waiters} ADD COLUMN IF NOT EXISTS kept boolean NOT NULL DEFAULT false;
CREATE {unlogged}TABLE IF NOT EXISTS {presence} (
	wake       text PRIMARY KEY, -- the store's own NOTIFY channel
	expires_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS {counter} (
	one boolean PRIMARY KEY DEFAULT true CHECK (one),
	v   bigint  NOT NULL
);
INSERT INTO {counter} (v) VALUES (0) ON CONFLICT DO NOTHING;
-- An older version minted fences from a sequence: its last value is a floor.
DO $mig$ BEGIN
	IF to_regclass({oldseq}) IS NOT NULL THEN
		EXECUTE format('UPDATE {counter} SET v = GREATEST(v, (SELECT last_value FROM %s))', {oldseq});
	END IF;
END $mig$;

DROP FUNCTION IF EXISTS {acquire}(text, text, bigint, text, bigint, boolean); -- before the channel argument
DROP FUNCTION IF EXISTS {acquire}(text, text, bigint, text, bigint, boolean, text, text); -- a development version
-- p_wake is the caller's store's own channel, on which a release notifies it
-- when it heads the queue ('': the shared p_channel).
-- It also keeps the row's waited flag: true while the key may have queue
-- entries or subscriptions. With p_kept_us > 0 (and a p_wake) the place is
-- kept by the store's presence: it lives p_kept_us, but no longer than the
-- presence, which a missing one re-creates for p_queue_us. A free key
-- whose live head is such a place is handed to the head, as a release
-- does (see {release3}): the head may be a place its process forgot, which
-- would otherwise hold up the queue for p_kept_us.
CREATE OR REPLACE FUNCTION {acquire4}(p_key text, p_token text, p_ttl_us bigint, p_holder text, p_queue_us bigint, p_durable boolean, p_channel text,
	p_wake text, p_kept_us bigint,
	OUT won boolean, OUT fence bigint, OUT remaining_us bigint, OUT holder text, OUT ahead integer)
LANGUAGE plpgsql AS $fn$
DECLARE
	now_ts  timestamptz;
	now_us  bigint;
	r       {locks}%ROWTYPE;
	held    boolean;
	head    text;
	me      timestamptz;
	v_fence bigint;
	v_floor bigint;
	v_ahead integer;
	v_waited boolean;
	cfg     text;
	v_kept  boolean := p_kept_us > 0 AND p_queue_us > 0 AND p_wake <> '';
	h_kept  boolean;
	h_ttl   bigint;
	h_holder text;
	h_chan  text;
	h_until timestamptz;
	g_until timestamptz;
BEGIN
	won := false; fence := 0; remaining_us := 0; holder := ''; ahead := 0;
	PERFORM pg_advisory_xact_lock({class}, hashtext(p_key));
	-- A new statement, so a new snapshot: it sees every row committed before
	-- the lock was granted. Read (and lock) the row before minting a fence:
	-- with no row, nothing can create one while we hold the advisory lock (a
	-- release grants only over the row it deletes), so the fast INSERT's
	-- clock is fresh; an INSERT first could wait for such a release with a
	-- clock read before its grant's fence.
	SELECT * INTO r FROM {locks} l WHERE l.key = p_key FOR UPDATE;
	now_ts := clock_timestamp();
	now_us := (extract(epoch FROM now_ts) * 1000000)::bigint;
	IF r.key IS NOT NULL AND NOT (isfinite(r.expires_at) AND isfinite(r.acquired_at) AND r.fence > 0) THEN
		RAISE EXCEPTION 'pgstore: bad lock row for key %', p_key USING ERRCODE = 'data_corrupted',
			HINT = 'delete it: leasehold release KEY --force';
	END IF;
	-- A presence lost (a crash of its UNLOGGED table) or lapsed comes back
	-- for the queue TTL, so that the place is live at once.
	IF v_kept AND NOT EXISTS (SELECT 1 FROM {presence} p WHERE p.wake = p_wake AND p.expires_at > now_ts) THEN
		INSERT INTO {presence} AS p (wake, expires_at) VALUES (p_wake, now_ts + p_queue_us * interval '1 microsecond')
		ON CONFLICT (wake) DO UPDATE SET expires_at = GREATEST(p.expires_at, EXCLUDED.expires_at);
	END IF;
	IF r.key IS NOT NULL AND r.token = p_token THEN -- a retry after a lost reply, or a release granted it to us: same fence
		UPDATE {locks} l SET expires_at = now_ts + p_ttl_us * interval '1 microsecond', holder = p_holder WHERE l.key = p_key;
		won := true; fence := r.fence;
		RETURN;
	END IF;
	IF r.key IS NULL THEN -- the common case: a free key with no queue, one INSERT
		INSERT INTO {locks} (key, token, holder, fence, expires_at, acquired_at, waited)
		SELECT p_key, p_token, p_holder, GREATEST(now_us, c.v + 1), now_ts + p_ttl_us * interval '1 microsecond', now_ts,
			EXISTS (SELECT 1 FROM {waiters} w WHERE w.key = p_key AND w.expires_at > now_ts)
		FROM {counter} c
		WHERE NOT EXISTS (SELECT 1 FROM {waiters} w WHERE w.key = p_key AND w.queued AND {live:w})
			AND CASE WHEN p_durable THEN true ELSE set_config('synchronous_commit', 'off', true) IS NOT NULL END
		ON CONFLICT (key) DO NOTHING
		RETURNING {locks}.fence INTO v_fence;
		IF FOUND THEN
			IF v_fence > now_us THEN -- ahead of the clock, which cannot cover its loss: record it durably
				UPDATE {counter} SET v = GREATEST(v, v_fence);
				PERFORM set_config('synchronous_commit', 'on', true);
			END IF;
			won := true; fence := v_fence;
			RETURN;
		END IF;
		-- A release may have granted the key to its queue's head since the
		-- first read (it does not take the advisory lock): read it again.
		SELECT * INTO r FROM {locks} l WHERE l.key = p_key FOR UPDATE;
		IF r.key IS NOT NULL AND r.token = p_token THEN -- granted to us by that release
			UPDATE {locks} l SET expires_at = now_ts + p_ttl_us * interval '1 microsecond', holder = p_holder WHERE l.key = p_key;
			won := true; fence := r.fence;
			RETURN;
		END IF;
	END IF;
	held := r.key IS NOT NULL AND r.expires_at > now_ts;
	-- One statement reads the queue's head, the floor and whether anyone
	-- else waits (by its own deadline: a place whose presence lapsed may
	-- come back with it), and (unless p_durable) turns off the WAL flush
	-- wait for this transaction.
	SELECT h.token, h.kept, h.ttl_us, h.holder, h.chan, h.dl,
		(SELECT c.v FROM {counter} c),
		EXISTS (SELECT 1 FROM {waiters} w WHERE w.key = p_key AND w.token <> p_token AND w.expires_at > now_ts),
		CASE WHEN p_durable THEN '' ELSE set_config('synchronous_commit', 'off', true) END
		INTO head, h_kept, h_ttl, h_holder, h_chan, h_until, v_floor, v_waited, cfg
		FROM (SELECT 1) x LEFT JOIN LATERAL (SELECT w.token, w.kept, w.ttl_us, w.holder, coalesce(nullif(w.wake, ''), p_channel) AS chan, {until:w} AS dl
			FROM {waiters} w WHERE w.key = p_key AND w.queued AND {live:w} ORDER BY w.enqueued_at, w.token LIMIT 1) h ON true;
	IF NOT held AND (head IS NULL OR head = p_token) THEN
		v_fence := GREATEST(coalesce(r.fence, 0) + 1, now_us, v_floor + 1);
		IF r.key IS NULL THEN
			INSERT INTO {locks} (key, token, holder, fence, expires_at, acquired_at, waited)
			VALUES (p_key, p_token, p_holder, v_fence, now_ts + p_ttl_us * interval '1 microsecond', now_ts, v_waited)
			ON CONFLICT (key) DO NOTHING;
			IF NOT FOUND THEN -- a row written around the key's lock (by hand): decide again
				RAISE EXCEPTION 'pgstore: row of key % appeared', p_key USING ERRCODE = 'serialization_failure';
			END IF;
		ELSE
			UPDATE {locks} l SET token = p_token, holder = p_holder, fence = v_fence,
				expires_at = now_ts + p_ttl_us * interval '1 microsecond', acquired_at = now_ts, waited = v_waited WHERE l.key = p_key;
		END IF;
		IF head IS NOT NULL THEN -- the head took the key: the queue's head changes
			DELETE FROM {waiters} w WHERE w.key = p_key AND (w.token = p_token OR NOT {live:w});
			IF EXISTS (SELECT 1 FROM {waiters} w WHERE w.key = p_key AND NOT w.queued AND w.expires_at > now_ts) THEN
				PERFORM pg_notify(p_channel, '0:' || p_key); -- wakes the key's observers only
			END IF;
		END IF;
		IF v_fence > now_us THEN -- ahead of the clock, which cannot cover its loss: record it durably
			UPDATE {counter} SET v = GREATEST(v, v_fence);
			PERFORM set_config('synchronous_commit', 'on', true);
		END IF;
		won := true; fence := v_fence;
		RETURN;
	END IF;
	IF NOT held AND h_kept AND h_ttl > 0 THEN -- a free key, a kept head: hand it the key as a release would
		v_fence := GREATEST(coalesce(r.fence, 0) + 1, now_us, v_floor + 1);
		g_until := LEAST(now_ts + h_ttl * interval '1 microsecond', h_until);
		IF r.key IS NULL THEN
			INSERT INTO {locks} (key, token, holder, fence, expires_at, acquired_at, waited)
			VALUES (p_key, head, h_holder, v_fence, g_until, now_ts, true)
			ON CONFLICT (key) DO NOTHING;
			IF NOT FOUND THEN -- a row written around the key's lock (by hand): decide again
				RAISE EXCEPTION 'pgstore: row of key % appeared', p_key USING ERRCODE = 'serialization_failure';
			END IF;
		ELSE
			UPDATE {locks} l SET token = head, holder = h_holder, fence = v_fence,
				expires_at = g_until, acquired_at = now_ts, waited = true WHERE l.key = p_key;
		END IF;
		IF v_fence > now_us THEN -- ahead of the clock, which cannot cover its loss: record it durably
			UPDATE {counter} SET v = GREATEST(v, v_fence);
			PERFORM set_config('synchronous_commit', 'on', true);
		END IF;
		DELETE FROM {waiters} w WHERE w.key = p_key AND w.token = head;
		PERFORM pg_notify(h_chan, 'g' || octet_length(head) || ':' || head || v_fence || ':' || (h_ttl / 1000) || ':' || p_key);
		IF h_chan <> p_channel AND EXISTS (SELECT 1 FROM {waiters} w WHERE w.key = p_key AND NOT w.queued AND w.expires_at > now_ts) THEN
			PERFORM pg_notify(p_channel, '0:' || p_key); -- the key changed hands: its observers learn it
		END IF;
		held := true;
		r.expires_at := g_until; r.holder := h_holder;
	END IF;
	IF held THEN
		remaining_us := GREATEST((extract(epoch FROM r.expires_at - now_ts) * 1000000)::bigint, 0);
		holder := r.holder;
	END IF;
	IF p_queue_us > 0 THEN
		-- A live place keeps its turn, stays kept once kept, and its
		-- deadline never moves back; a dead one (or a subscription row)
		-- starts anew at the back.
		INSERT INTO {waiters} AS w (key, token, holder, queued, enqueued_at, expires_at, ttl_us, wake, kept)
		VALUES (p_key, p_token, p_holder, true, now_ts,
			now_ts + CASE WHEN v_kept THEN p_kept_us ELSE p_queue_us END * interval '1 microsecond', p_ttl_us, p_wake, v_kept)
		ON CONFLICT (key, token) DO UPDATE SET holder = EXCLUDED.holder, queued = true, ttl_us = EXCLUDED.ttl_us, wake = EXCLUDED.wake,
			kept = CASE WHEN w.queued AND {live:w} THEN w.kept OR EXCLUDED.kept ELSE EXCLUDED.kept END,
			expires_at = CASE WHEN w.queued AND {live:w} THEN GREATEST(w.expires_at, EXCLUDED.expires_at) ELSE EXCLUDED.expires_at END,
			enqueued_at = CASE WHEN w.queued AND {live:w} THEN w.enqueued_at ELSE now_ts END
		RETURNING w.enqueued_at INTO me;
		-- Under the row's lock (taken above): a release that waited for it
		-- reads the flag from the row it then updates.
		UPDATE {locks} l SET waited = true WHERE l.key = p_key AND NOT l.waited;
		SELECT count(*) INTO v_ahead FROM {waiters} w WHERE w.key = p_key AND w.queued AND {live:w}
			AND (w.enqueued_at, w.token) < (me, p_token);
	ELSE
		SELECT count(*) INTO v_ahead FROM {waiters} w WHERE w.key = p_key AND w.queued AND {live:w};
	END IF;
	ahead := v_ahead;
END
$fn$;

-- {acquire3}, {acquire2} and {acquire} are the acquires of earlier
-- versions, kept for replicas that still call them during a rolling
-- upgrade.
CREATE OR REPLACE FUNCTION {acquire3}(p_key text, p_token text, p_ttl_us bigint, p_holder text, p_queue_us bigint, p_durable boolean, p_channel text,
	p_wake text,
	OUT won boolean, OUT fence bigint, OUT remaining_us bigint, OUT holder text, OUT ahead integer)
LANGUAGE sql AS $fn$
	SELECT * FROM {acquire4}(p_key, p_token, p_ttl_us, p_holder, p_queue_us, p_durable, p_channel, p_wake, 0)
$fn$;
CREATE OR REPLACE FUNCTION {acquire2}(p_key text, p_token text, p_ttl_us bigint, p_holder text, p_queue_us bigint, p_durable boolean, p_channel text,
	p_wake text,
	OUT won boolean, OUT fence bigint, OUT remaining_us bigint, OUT holder text, OUT ahead integer)
LANGUAGE sql AS $fn$
	SELECT * FROM {acquire4}(p_key, p_token, p_ttl_us, p_holder, p_queue_us, p_durable, p_channel, p_wake, 0)
$fn$;
CREATE OR REPLACE FUNCTION {acquire}(p_key text, p_token text, p_ttl_us bigint, p_holder text, p_queue_us bigint, p_durable boolean, p_channel text,
	OUT won boolean, OUT fence bigint, OUT remaining_us bigint, OUT holder text, OUT ahead integer)
LANGUAGE sql AS $fn$
	SELECT * FROM {acquire4}(p_key, p_token, p_ttl_us, p_holder, p_queue_us, p_durable, p_channel, '', 0)
$fn$;

-- {release} returns 0 (released), 1 (another token holds the key) or 2
-- (nobody holds it). It removes p_token from the queue. When it deleted
-- p_token's own lock and the queue has a live head that asked for a TTL,
-- it grants the key to that head in the same transaction (a new row with
-- the head's token, holder and TTL, capped at its queue deadline, and a
-- fresh fence by the acquire rules) and notifies it on p_channel: 'g', the
-- head token's length in bytes, ':', the token, the fence, ':', the TTL in
-- ms, ':', the key. Otherwise, when the key became free for a new head, it
-- wakes that head (the token's length, ':', the token, the key), or, with
-- no queue, the key's subscribers ('*:' then the key).
-- A grant marks the new row as waited for (its release goes through this
-- function, which re-reads the queue). A head kept by its store's presence
-- is live while the presence is, and its grant ends no later.
CREATE OR REPLACE FUNCTION {release3}(p_key text, p_token text, p_channel text, p_durable boolean)
RETURNS integer LANGUAGE plpgsql AS $fn$
DECLARE
	now_ts  timestamptz;
	now_us  bigint;
	res     integer;
	f       bigint;
	heads   text[];
	head    text;
	granted text;
	subs    boolean;
	entries boolean;
	mine    boolean := false;
	cfg     text;
	g_holder text;
	g_ttl   bigint;
	g_until timestamptz;
	g_chan  text;
	v_fence bigint;
BEGIN
	-- The key's advisory lock serializes this release with every acquire
	-- and release of the key, so each sees the queue and the lock as the
	-- one before left them: without it, a waiter leaving (p_token holds
	-- nothing) beside a release that grants it the key, or beside an
	-- acquire that makes a new holder whose release then reads the queue
	-- before the leaving waiter's entry is gone, left the key granted to a
	-- waiter that was gone, until its queue deadline.
	PERFORM pg_advisory_xact_lock({class}, hashtext(p_key));
	now_ts := clock_timestamp();
	now_us := (extract(epoch FROM now_ts) * 1000000)::bigint;
	DELETE FROM {locks} l WHERE l.key = p_key AND l.token = p_token
		RETURNING CASE WHEN l.expires_at > now_ts THEN 0 ELSE 2 END, l.fence,
			CASE WHEN p_durable OR l.fence >= now_us THEN '' ELSE set_config('synchronous_commit', 'off', true) END
		INTO res, f, cfg;
	IF NOT FOUND THEN
		-- p_token's own fast acquire (a plain UPDATE of the free row, which
		-- takes the row but not the advisory lock) may not have committed
		-- yet, its caller having given up: wait for whoever holds the
		-- key's row, then look again with a new snapshot, so that such a
		-- grant is released, not left to expire.
		PERFORM 1 FROM {locks} l WHERE l.key = p_key FOR UPDATE;
		DELETE FROM {locks} l WHERE l.key = p_key AND l.token = p_token
			RETURNING CASE WHEN l.expires_at > now_ts THEN 0 ELSE 2 END, l.fence,
				CASE WHEN p_durable OR l.fence >= now_us THEN '' ELSE set_config('synchronous_commit', 'off', true) END
			INTO res, f, cfg;
	END IF;
	IF NOT FOUND THEN
		SELECT CASE WHEN EXISTS (SELECT 1 FROM {locks} l WHERE l.key = p_key AND l.expires_at > now_ts) THEN 1 ELSE 2 END,
			EXISTS (SELECT 1 FROM {waiters} w WHERE w.key = p_key),
			CASE WHEN p_durable THEN '' ELSE set_config('synchronous_commit', 'off', true) END
			INTO res, entries, cfg;
	ELSE
		mine := true;
		-- A statement of its own, so a snapshot taken after the DELETE got
		-- the row: an acquire that held the row's lock while it joined the
		-- queue has committed, and its entry is seen (the DELETE's own
		-- snapshot is from before it waited).
		SELECT EXISTS (SELECT 1 FROM {waiters} w WHERE w.key = p_key) INTO entries;
		IF f >= now_us THEN -- the next grant must come above it without this row
			UPDATE {counter} SET v = GREATEST(v, f);
		END IF;
	END IF;
	IF NOT entries THEN -- nobody waits: nothing to notify, no entry to remove
		RETURN res;
	END IF;
	-- The first two live queued tokens and whether there are live
	-- subscriptions.
	SELECT (SELECT array_agg(q.token) FROM (SELECT w.token FROM {waiters} w
			WHERE w.key = p_key AND w.queued AND {live:w} ORDER BY w.enqueued_at, w.token LIMIT 2) q),
		EXISTS (SELECT 1 FROM {waiters} w WHERE w.key = p_key AND NOT w.queued AND w.expires_at > now_ts AND w.token <> p_token)
		INTO heads, subs;
	IF res <> 1 THEN -- the key is free: hand it to the head, or wake the head if it is new
		IF heads[1] = p_token THEN -- the head leaves: the next one is the new head
			head := heads[2];
		ELSIF res = 0 OR mine THEN
			head := heads[1];
		END IF;
		IF head IS NOT NULL THEN -- notify the head on its store's own channel, when it has one
			SELECT w.holder, w.ttl_us, {until:w}, coalesce(nullif(w.wake, ''), p_channel) INTO g_holder, g_ttl, g_until, g_chan
				FROM {waiters} w WHERE w.key = p_key AND w.token = head;
			IF NOT FOUND THEN -- the head left since the queue was read: nobody to notify or grant
				head := NULL;
			END IF;
		END IF;
		IF head IS NOT NULL AND mine THEN -- we held the row: grant the key to the head
			IF g_ttl > 0 THEN -- 0: queued by an older version, which acquires itself
				v_fence := GREATEST(f + 1, now_us, (SELECT c.v FROM {counter} c) + 1);
				INSERT INTO {locks} (key, token, holder, fence, expires_at, acquired_at, waited)
				VALUES (p_key, head, g_holder, v_fence, LEAST(now_ts + g_ttl * interval '1 microsecond', g_until), now_ts, true)
				ON CONFLICT (key) DO NOTHING;
				IF FOUND THEN
					IF v_fence > now_us THEN -- ahead of the clock: record it durably
						UPDATE {counter} SET v = GREATEST(v, v_fence);
						PERFORM set_config('synchronous_commit', 'on', true);
					END IF;
					granted := head;
					PERFORM pg_notify(g_chan, 'g' || octet_length(head) || ':' || head || v_fence || ':' || (g_ttl / 1000) || ':' || p_key);
					IF subs AND g_chan <> p_channel THEN -- the key changed hands: its observers learn it
						PERFORM pg_notify(p_channel, '0:' || p_key);
					END IF;
				END IF;
			END IF;
		END IF;
		IF granted IS NOT NULL THEN
			NULL; -- notified above
		ELSIF head IS NOT NULL THEN
			PERFORM pg_notify(g_chan, octet_length(head) || ':' || head || p_key);
			IF subs AND g_chan <> p_channel THEN
				PERFORM pg_notify(p_channel, '0:' || p_key);
			END IF;
		ELSIF res = 0 AND heads IS NULL AND subs THEN
			PERFORM pg_notify(p_channel, '*:' || p_key);
		END IF;
	END IF;
	DELETE FROM {waiters} w WHERE w.key = p_key AND (w.token = p_token OR w.token = granted OR NOT {live:w});
	RETURN res;
END
$fn$;

-- {release2} and {release} are the releases of earlier versions, kept for
-- replicas that still call them during a rolling upgrade.
CREATE OR REPLACE FUNCTION {release2}(p_key text, p_token text, p_channel text, p_durable boolean)
RETURNS integer LANGUAGE sql AS $fn$
	SELECT {release3}(p_key, p_token, p_channel, p_durable)
$fn$;
CREATE OR REPLACE FUNCTION {release}(p_key text, p_token text, p_channel text, p_durable boolean)
RETURNS integer LANGUAGE sql AS $fn$
	SELECT {release3}(p_key, p_token, p_channel, p_durable)
$fn$;

-- {subscribe} records p_token's WaitRelease subscription to p_key for p_us
-- µs (a queue entry keeps its own deadline) and marks the key's row, when
-- there is one, as waited for, under its row lock, so that the plain
-- release, which notifies nobody, does not apply. It takes the key's
-- advisory lock first, as an acquire does, and marks the row in a
-- statement of its own: an acquire that was creating the row (it read the
-- waiters before this subscription) has committed, and the row is seen.
CREATE OR REPLACE FUNCTION {subscribe}(p_key text, p_token text, p_us bigint)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
	PERFORM pg_advisory_xact_lock({class}, hashtext(p_key));
	UPDATE {locks} l SET waited = true WHERE l.key = p_key AND NOT l.waited;
	INSERT INTO {waiters} AS w (key, token, holder, queued, enqueued_at, expires_at)
	VALUES (p_key, p_token, '', false, clock_timestamp(), clock_timestamp() + p_us * interval '1 microsecond')
	ON CONFLICT (key, token) DO UPDATE SET expires_at = CASE WHEN w.queued THEN w.expires_at ELSE GREATEST(w.expires_at, EXCLUDED.expires_at) END;
END
$fn$;

-- {force} deletes the key's lock whatever its token, returns it and wakes
-- the head (or the subscribers) as a release does.
CREATE OR REPLACE FUNCTION {force}(p_key text, p_channel text, p_durable boolean)
RETURNS TABLE (key text, token text, holder text, fence bigint, expires_at timestamptz, acquired_at timestamptz, now_us bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
	r      {locks}%ROWTYPE;
	now_ts timestamptz;
BEGIN
	PERFORM pg_advisory_xact_lock({class}, hashtext(p_key));
	SELECT * INTO r FROM {locks} l WHERE l.key = p_key FOR UPDATE;
	IF NOT FOUND THEN
		RETURN;
	END IF;
	PERFORM {release3}(p_key, r.token, p_channel, p_durable);
	now_ts := clock_timestamp();
	IF r.expires_at > now_ts THEN
		RETURN QUERY SELECT r.key, r.token, r.holder, r.fence, r.expires_at, r.acquired_at, (extract(epoch FROM now_ts) * 1000000)::bigint;
	END IF;
END
$fn$;
`
