// Package leasehold provides distributed leases for Go services that run as
// several replicas and must not do the same work twice: job schedulers,
// workflow engines, reconcilers, approval gates.
//
// A Locker hands out a *Lease per key from a Store (memstore embedded,
// redisstore, etcdstore). A lease carries:
//
//   - an owner token (128 random bits): renew and release are token-checked on
//     the server, so a holder never deletes or extends another owner's lock;
//   - a fence token that is strictly greater for every acquisition of the key:
//     pass it to the storage you write to (package fence) so that a holder that
//     was paused past its TTL cannot overwrite a newer holder's work;
//   - a context that is cancelled, with a cause, the moment ownership can no
//     longer be trusted: ErrLeaseLost, ErrLeaseAbandoned, ErrLeaseExpired,
//     ErrMaxHoldReached, ErrLeaseReleased, ErrLockerClosed.
//
// The four patterns: Do (per-item lease with explicit release), Hold and Loop
// (per-loop TTL hold), fencing at the write boundary (package fence), and the
// local gate built into every Locker (goroutines of one process contend
// locally, in FIFO order, so a process sends one request per key, not one per
// goroutine).
//
// # The engine
//
// One scheduler goroutine per Locker holds a heap of every lease's deadlines:
// the next renewal, the local expiry guard and the maximum hold time. A lease
// is identity (key, token, fence, TTL), a context with a cause, and those
// deadlines; the state machine is written down in scheduler.go. Renewals that
// fall due together go out in one batch (BatchRenewer) in a goroutine the
// scheduler owns and joins, so a slow store never delays another lease's
// guard, and a thousand held leases add no goroutine. Release and Close
// return only when nothing about the lease (observer, log) is still running.
//
// # Renewal and its failure budget
//
// Leases from TryAcquire, Acquire and Do are renewed every RenewInterval
// (TTL/3), each attempt bounded by RenewTimeout. After MaxRenewFailures
// consecutive failures the lease is abandoned; a renewal answered "not owned"
// ends it at once. After a failure the attempts left are spread over the time
// before the local guard, and the default RenewTimeout makes them fit (see
// Budget, the formula `leasehold calibrate` uses too), so with the defaults
// the budget, not the guard, ends a lease whose renewals keep failing.
// Independently, a local expiry guard cancels the context when the holder's
// monotonic clock says the TTL has run out since the last successful renewal,
// measured from before that request was sent, minus DriftMargin: the holder
// learns of the loss before the store expires the key. A renewal the store
// applied after the lease ended is undone with a token-checked release.
// RenewalContinue keeps going instead, for work whose duplicates are cheap.
//
// # Waiting: the queue
//
// Acquire and Do wait in a FIFO queue per key kept in the store, so waiting
// is fair across processes. A waiter keeps its place by refreshing it every
// WaiterTTL/3 (a dead waiter drops out after WaiterTTL), wakes on the store's
// notification, or at the holder's exact remaining TTL when it is next in
// line, and polls every WaitCap only as a safety net. Its own context bounds
// everything it waits on; when it gives up it leaves the queue. TryAcquire,
// Hold and Do with TryOnce never queue. Do's WaitTimeout bounds the wait and
// not the work.
//
// ErrNotAcquired means an answer from the store showed another owner. A store
// that gave no answer before the deadline is a store failure (ErrStore).
//
// # When the store itself fails
//
// FailClosed (the default) returns the store's error: nothing runs. FailOpen
// returns a degraded, local-only lease (Degraded() == true, fence 0) and logs
// one line saying that cross-replica races are now possible, but only on an
// error the store marked as an outage (ErrUnavailable: refused or reset
// connection, timeout, a server loading or failing over). Contention, a
// misconfigured store (ErrMisconfigured: credentials, permissions, TLS,
// protocol, schema) and any error the store did not classify fail closed.
// Use one Locker per risk class.
//
// # What is not guaranteed
//
// A lease is not a mutex. Between the check of a lease and a write, a process
// can pause (GC, swap, SIGSTOP) past its TTL while another replica acquires
// the key; only storage that checks the fence (package fence) rejects the
// stale write. The local guard assumes the holder's and the store's clocks run
// at the same rate (within DriftMargin over one TTL), not that they agree on
// the time. Under FailOpen, replicas can run the same work. A store that loses
// acknowledged writes (Redis failover to a lagging replica) can hand the same
// key to two owners; the fence still increases (see redisstore), so fenced
// writes stay safe. Use etcdstore where the lock itself must survive such
// failures.
package leasehold
