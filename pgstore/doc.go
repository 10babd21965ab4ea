// Package pgstore is the PostgreSQL lock store for leasehold, over pgx v5,
// for teams that run PostgreSQL and not Redis.
//
// [Open] connects to a DSN, pins READ COMMITTED on its pool and creates or
// upgrades the store's objects (tables and functions named after
// Options.Table, default public.leasehold_locks; see [MigrationSQL]). [New]
// takes your own pool and does no DDL unless Options.Migrate is
// [MigrateCreate]; with [MigrateNever] the role needs only the table and
// function rights listed in README.md. Options.Durable trades WAL for locks
// that survive a crash; Options.Listen dials the LISTEN connection (set it
// behind PgBouncer in transaction mode, where LISTEN does not work).
//
// # Guarantees
//
// Every operation is one statement, one round trip. Expiry is decided by the
// database's clock alone, so clients with skewed clocks agree on who holds a
// lock. A fence is GREATEST(row fence + 1, database clock in µs, floor + 1),
// minted once the key's lock and row are held: per key, fences strictly
// increase across releases, expiry, takeovers, sweeps and stores sharing the
// tables, and also across a crash, as long as the database clock does not
// step back across it. Waiters queue per key in FIFO order; a release grants
// the key to the live head in the same statement and notifies only that
// head's store. A retried Acquire with the same token returns the same fence.
// Only an outage wraps [driver.ErrUnavailable] (the one error a FailOpen
// Locker fails open on); missing privileges and failed logins wrap
// [driver.ErrAccessDenied], everything else [driver.ErrMisconfigured].
//
// # What is not guaranteed
//
// By default the lock and waiter tables are UNLOGGED: a database crash, or
// the promotion of a standby, loses every lock and queue entry, and holders
// may overlap a new holder until their next renewal (ErrNotOwned); the new
// holder's fence is larger, so fenced writes stay ordered. The holder's local
// guard fires no later than the database expires the row only while the
// database's clock does not run faster than the holder's by more than the
// Locker's drift margin: run NTP in slew mode.
//
// README.md has the objects, the psql runbook, fences, durability, rolling
// upgrades and privileges.
package pgstore
