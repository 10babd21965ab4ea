// Package pgstore is the PostgreSQL lock store for leasehold, over pgx v5,
// for teams that run PostgreSQL and not Redis.
//
// # Objects
//
// Named after Options.Table (default public.leasehold_locks; see
// MigrationSQL and README.md):
//
//	leasehold_locks          key, token, holder, fence, expires_at, acquired_at, waited: one row
//	                         per key, held, expired or free (a release nobody waited for keeps it
//	                         with an empty token and its fence; a sweep deletes old free rows)
//	leasehold_locks_waiters  the per-key FIFO queue (queued rows) and WaitRelease subscriptions
//	leasehold_locks_counter  one row: the durable fence floor
//	leasehold_locks_acquire3, _release2, _force_release  PL/pgSQL functions
//	leasehold_locks_acquire2, _acquire, _release  the functions of earlier versions (wrappers)
//
// # Round trips
//
// Every operation is one statement, one round trip: Acquire and Release are
// one plain UPDATE of the key's row when it is free and nobody waits for it
// (the fast path, a HOT update), and call their function otherwise, in the
// same statement; a store sends the plain UPDATE alone for a key whose last
// release it saw keep the row, and the full statement after it when it did
// not apply. Renew is a token-checked UPDATE, RenewBatch one UPDATE over
// unnest'ed arrays, Inspect and List one SELECT. The acquire function takes
// the key's advisory transaction lock and row, drops nothing it does not
// own, applies the queue rule (the key goes to a free key's live queue head,
// or to anyone when the queue is empty), and either grants or reports the
// holder's remaining TTL, identity and the waiters ahead (joining the queue
// when QueueTTL > 0). A retry with the same token returns the same fence.
// The release statement takes the same advisory lock before the row, so the
// acquires and releases of a key that has waiters run one after the other
// (the plain UPDATE sent alone for a free key takes only the row).
//
// # Fences
//
// A fence is GREATEST(row fence + 1, database clock in µs, floor + 1),
// computed only once the key's lock and row are held, so an acquirer that
// was slow to win can never hand out an older fence. The fast acquire
// updates the key's row under its row lock, and only when the row's fence
// and the floor are below the clock (so its fence is never ahead of it). A
// release with nobody waiting keeps the row, free, with its fence; the
// release function deletes it and, when the row's fence is not below the
// clock, first raises the floor to it. A sweep deletes free rows released
// over a minute ago with a fence over a minute below the clock. Per key,
// fences strictly increase across releases, expiry, takeovers, sweeps and
// stores sharing the tables.
//
// # Durability
//
// By default the lock and waiter tables are UNLOGGED and acquire and release
// commit with synchronous_commit off: an uncontended cycle writes no WAL for
// its rows and waits for no flush. The price: a database crash (or the
// promotion of a standby, which has no UNLOGGED rows) loses every lock and
// queue entry. Holders learn it at their next renewal (ErrNotOwned, so their
// lease is lost) and may overlap a new holder until then; the new holder's
// fence is larger, so fenced writes stay ordered. Fences survive because
// every fence is either below the database clock, which keeps rising, or
// recorded, with a durable commit, in the logged floor counter when it was
// granted. This holds as long as the database clock does not step back
// across the crash (the Redis store's assumption after data loss too).
// Options.Durable creates logged tables and commits durably instead: locks
// survive a crash and reach streaming standbys, at the cost of WAL for
// every acquire and release.
// A Locker checks once, in the background after its first acquisition
// (CheckConfig), and warns when an UNLOGGED lock table has a streaming
// standby, or a Durable store's role commits with synchronous_commit off.
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
// margin. Run NTP in slew mode on the database server.
//
// # Isolation
//
// The statements expect READ COMMITTED; Open pins it on its pool. Under a
// REPEATABLE READ or SERIALIZABLE default (a pool passed to New), a
// serialization failure (SQLSTATE 40001) is retried, so contention is still
// ErrNotAcquired and never a store error.
//
// # Waiting and hand-off
//
// LISTEN needs a connection of its own: a Store opens one (Options.Listen;
// by default with the connection settings of the *pgxpool.Pool it was given)
// on the first WaitRelease, shares it among all waiters, and closes it in
// Close; each waiter's context bounds only its own wait for it.
//
// A waiting Acquire records the TTL it asks for in its queue entry. A
// release of a lock whose queue has a live head grants the key to that head
// in the same statement: the row gets the head's token, holder and TTL
// (capped at the head's queue deadline) and a fresh fence by the acquire
// rules, the head leaves the queue, and the NOTIFY payload names the head
// and carries the grant. It goes to the head's store's own channel
// (WakeChannel, recorded in the queue entry; the store LISTENs on it beside
// the shared Channel), so only that process and its waiter wake; the
// waiter's Locker takes the lease from it (leasehold.Granter), or its next
// Acquire finds its own token holding the key (the retry path: same fence,
// TTL extended). A waiter that gives up calls Release with its token, which
// frees a grant it may have received and hands the key to the next head.
//
// WaitRelease writes no row for a token this store has queued (its queue
// entry makes releases notify it); for other tokens and observers it writes
// a subscription row, so that releases of a key without a queue notify, and
// deletes it when the subscriber stops. A release notifies only when the
// key has a live queue head or live subscriptions, so uncontended releases
// send nothing and never queue on the cluster-wide NOTIFY lock. When the
// LISTEN connection is lost, and again when it is back, every waiter is
// woken to re-check. Behind PgBouncer in transaction mode LISTEN does not
// work: point Listen at the server directly.
//
// Close releases, in one statement, every lock the store acquired and did
// not release and every queue entry it wrote (each through the release
// function, so the next head gets the key), and deletes its subscription
// rows: a closed store leaves no rows behind but the fence counter. What it
// cannot reach then ends at its TTL.
//
// # Privileges
//
// Open (and New with MigrateCreate) creates or upgrades the objects, which
// needs CREATE on the schema. With MigrateNever a role needs only SELECT,
// INSERT, UPDATE, DELETE on the lock and waiter tables, SELECT, UPDATE on
// the counter, and EXECUTE on the functions (granted to PUBLIC by default).
// For semaphores, also SELECT, INSERT, UPDATE, DELETE on the tables
// Table+"_permits", "_permit_queue" and "_permit_limits". Missing privileges
// and failed logins wrap leasehold.ErrAccessDenied, missing objects
// leasehold.ErrMisconfigured.
//
// # Errors
//
// One classification (errors.go): SQLSTATE class 08, 53, shutdown and
// startup (57P01-03, 57P05), statement and lock timeouts, a read-only
// standby, and a refused, reset or timed-out dial or a connection lost after
// it was established are outages (leasehold.ErrUnavailable, the only errors
// a FailOpen Locker fails open on); everything else is a configuration
// error: TLS, a server that does not speak PostgreSQL (a port that takes the
// connection and never answers is not proven down), missing objects, any
// unclassified error.
package pgstore
