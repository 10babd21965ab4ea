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
// locally, so a process sends one request per key, not one per goroutine).
//
// # Renewal and its failure budget
//
// Leases from TryAcquire, Acquire and Do are renewed every RenewInterval
// (TTL/3), each attempt bounded by RenewTimeout. After MaxRenewFailures
// consecutive failures the lease is abandoned; a renewal answered "not owned"
// ends it at once. Independently, a local expiry guard cancels the context when
// the holder's monotonic clock says the TTL has run out since the last
// successful renewal, measured from before that request was sent, minus
// DriftMargin: the holder learns of the loss before the store expires the key.
// RenewalContinue keeps going instead, for work whose duplicates are cheap.
//
// # When the store itself fails
//
// FailClosed (the default) returns the store's error: nothing runs. FailOpen
// returns a degraded, local-only lease (Degraded() == true, fence 0) and logs
// one line saying that cross-replica races are now possible. Contention is
// never turned into fail-open. Use one Locker per risk class.
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
