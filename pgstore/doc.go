// Package pgstore is the PostgreSQL lock store for leasehold, over pgx v5,
// for teams that run PostgreSQL and not Redis.
//
// # Table layout
//
// One row per held (or expired, not yet taken over) lock, in a table
// (default public.leasehold_locks) and a sequence that mints fences (default
// public.leasehold_locks_fence); see MigrationSQL:
//
//	key         text COLLATE "C" PRIMARY KEY   the lock key
//	token       text        NOT NULL           the owner token
//	fence       bigint      NOT NULL           the holder's fence, from the sequence
//	expires_at  timestamptz NOT NULL           by the database clock
//	acquired_at timestamptz NOT NULL           by the database clock
//
// Releases NOTIFY the key on the channel Options.Channel (default
// "public.leasehold_locks"). Runbook (psql):
//
//	-- owner, fence and remaining TTL of one lock
//	SELECT token, fence, expires_at - clock_timestamp() AS remaining
//	  FROM leasehold_locks WHERE key = 'scheduler:job:42' AND expires_at > clock_timestamp();
//	-- every live lock under a prefix
//	SELECT key, token, fence, expires_at - clock_timestamp() AS remaining
//	  FROM leasehold_locks WHERE key LIKE 'scheduler:%' AND expires_at > clock_timestamp() ORDER BY key;
//	LISTEN "public.leasehold_locks";   -- watch releases
//
// # Round trips
//
// Every operation is one statement, one round trip. Acquire is an INSERT ...
// ON CONFLICT DO UPDATE that takes a free or expired row, or refreshes the
// caller's own row (a retry after a lost reply: same fence, TTL extended),
// with a fallback SELECT in the same statement that reports the holder's
// remaining TTL on contention. Renew is a token-checked UPDATE of
// expires_at; Release a token-checked DELETE that calls pg_notify in the same
// statement; ForceRelease deletes whatever token holds the key and notifies.
// Expired rows are not swept: the next Acquire of the key takes them over,
// and Inspect and List skip them.
//
// # Clocks
//
// Expiry is decided by the database's clock alone: the client sends a TTL,
// and every statement compares expires_at with clock_timestamp() on the
// server, so clients with skewed clocks agree on who holds a lock. The
// holder's local expiry guard (in the Locker) uses the holder's own
// monotonic clock, measured from before the request was sent, so it fires no
// later than the database expires the row as long as the database's clock
// does not run faster than the holder's by more than the Locker's drift
// margin. A database clock that steps forward expires locks early; run NTP in
// slew mode on the database server.
//
// # Fences
//
// A fence is max(nextval of the sequence, the database clock in µs), and the
// sequence is moved up to it (setval): strictly increasing for every
// acquisition of every key, also after the lock rows are lost (TRUNCATE, a
// deleted row). The sequence keeps fences rising if the database clock steps
// back; the clock floor keeps them rising if the sequence is lost or behind
// (a restore from backup, a promoted standby that lagged) as long as the
// clock does not step back at the same time: the same assumption as the
// Redis store. Contended tries consume sequence values too; fences only need
// to increase.
// With synchronous replication, a promoted standby has every committed row.
//
// # Waiting
//
// LISTEN needs a connection of its own: a Store opens one (Options.Listen;
// by default with the connection settings of the *pgxpool.Pool it was given)
// on the first WaitRelease, shares it among all waiters, and closes it in
// Close. When that connection is lost it is re-opened with backoff; releases
// in between are missed and waiters fall back on the holder's TTL, and every
// waiter is woken once when the connection is back. Behind PgBouncer in
// transaction mode LISTEN does not work: point Listen at the server directly.
//
// # Privileges
//
// Open (and New with MigrateCreate) creates the table and the sequence when
// missing, which needs CREATE on the schema. With MigrateNever a role needs
// only SELECT, INSERT, UPDATE, DELETE on the table and USAGE, UPDATE on the
// sequence (setval needs UPDATE; pg_notify and LISTEN need no grant).
package pgstore
