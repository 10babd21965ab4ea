package pgstore

import (
	"fmt"
	"hash/fnv"

	"github.com/jackc/pgx/v5"
)

// Every statement reads time from the database clock (clock_timestamp()),
// never from the client. TTLs travel as whole microseconds.
const (
	ttlExpr = `($3::bigint * interval '1 microsecond')`
	remExpr = `(extract(epoch FROM (expires_at - clock_timestamp())) * 1000000)::bigint`
	cols    = `key, token, fence, ` + remExpr + `, acquired_at, expires_at`
	// fenceExpr mints a fence: max(next sequence value, database clock in
	// µs), and moves the sequence up to it. The sequence keeps fences rising
	// if the clock steps back; the clock floor keeps them rising if the
	// sequence is lost or behind (promotion of a lagging standby, a restore),
	// as long as the database clock does not step back at the same time.
	fenceExpr = `setval($4::regclass, GREATEST(nextval($4::regclass), (extract(epoch FROM now.ts) * 1000000)::bigint))`
)

// buildSQL renders the statements once, with the quoted table name spliced
// in; every value is a parameter.
func (s *Store) buildSQL() {
	t := s.table
	// $1 key, $2 token, $3 TTL µs, $4 sequence name. One reading of the
	// database clock (now.ts) is the acquisition time, the base of the
	// expiry and the instant the holder's row is judged expired at. The
	// upsert takes a free or expired row, or refreshes our own (same fence);
	// when it does nothing, the fallback reads the holder's remaining TTL. nextval is
	// consumed even when the key is held: fences only need to increase.
	s.acquireSQL = `WITH up AS (
	INSERT INTO ` + t + ` AS t (key, token, fence, expires_at, acquired_at)
	SELECT $1, $2, ` + fenceExpr + `, now.ts + ` + ttlExpr + `, now.ts
	FROM (SELECT clock_timestamp() AS ts) AS now
	ON CONFLICT (key) DO UPDATE SET
		token       = EXCLUDED.token,
		fence       = CASE WHEN t.token = EXCLUDED.token THEN t.fence ELSE EXCLUDED.fence END,
		expires_at  = EXCLUDED.expires_at,
		acquired_at = CASE WHEN t.token = EXCLUDED.token THEN t.acquired_at ELSE EXCLUDED.acquired_at END
	WHERE t.expires_at <= EXCLUDED.acquired_at OR t.token = EXCLUDED.token
	RETURNING fence
)
SELECT true, fence, 0::bigint FROM up
UNION ALL
SELECT false, 0::bigint, ` + remExpr + ` FROM ` + t + ` WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM up)`

	s.renewSQL = `UPDATE ` + t + ` SET expires_at = clock_timestamp() + ` + ttlExpr + `
WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp()`

	// Many renewals in one statement: $1 keys, $2 tokens, $3 TTLs in µs,
	// as arrays; it returns the keys it renewed.
	s.renewBatchSQL = `UPDATE ` + t + ` AS l SET expires_at = clock_timestamp() + r.us * interval '1 microsecond'
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(key, token, us)
WHERE l.key = r.key AND l.token = r.token AND l.expires_at > clock_timestamp()
RETURNING l.key`

	// $3 channel. The command tag counts the notified (= deleted) rows.
	s.releaseSQL = `WITH d AS (
	DELETE FROM ` + t + ` WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp() RETURNING key
)
SELECT pg_notify($3, key) FROM d`

	s.inspectSQL = `SELECT ` + cols + `, true FROM ` + t + `
WHERE key = $1 AND expires_at > clock_timestamp()`

	s.listSQL = `SELECT ` + cols + `, true FROM ` + t + `
WHERE key LIKE $1 ESCAPE E'\\' AND expires_at > clock_timestamp()
ORDER BY key COLLATE "C"`

	// $2 channel. pg_notify returns void, which IS NOT NULL: the column is
	// "live" and sends the notification in the same statement.
	s.forceSQL = `WITH d AS (
	DELETE FROM ` + t + ` WHERE key = $1 RETURNING key, token, fence, acquired_at, expires_at
)
SELECT ` + cols + `, pg_notify($2, key) IS NOT NULL AND expires_at > clock_timestamp() FROM d`
}

// migrateSQL creates the table and the sequence when missing, in one
// implicit transaction (one simple-protocol string) under a transaction-level
// advisory lock, so replicas starting together do not collide.
func (s *Store) migrateSQL() string {
	h := fnv.New64a()
	h.Write([]byte("leasehold.pgstore.migrate:" + s.table))
	return fmt.Sprintf("SELECT pg_advisory_xact_lock(%d);\n", int64(h.Sum64())) +
		MigrationSQL(s.names[0], s.names[1], s.names[2]) +
		SemaphoreMigrationSQL(s.names[0], s.names[1])
}

// MigrationSQL returns the DDL that creates a lock table and its fence
// sequence when missing (IF NOT EXISTS), for running by hand or from a
// migration tool. Empty arguments mean the defaults (see Options).
func MigrationSQL(schema, table, sequence string) string {
	if schema == "" {
		schema = DefaultSchema
	}
	if table == "" {
		table = DefaultTable
	}
	if sequence == "" {
		sequence = table + "_fence"
	}
	t := pgx.Identifier{schema, table}.Sanitize()
	q := pgx.Identifier{schema, sequence}.Sanitize()
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	key         text COLLATE "C" PRIMARY KEY,
	token       text        NOT NULL,
	fence       bigint      NOT NULL,
	expires_at  timestamptz NOT NULL,
	acquired_at timestamptz NOT NULL
);
CREATE SEQUENCE IF NOT EXISTS %s AS bigint MINVALUE 1 NO CYCLE;
`, t, q)
}
