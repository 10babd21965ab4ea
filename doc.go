// Package leasehold provides distributed leases for Go services that run as
// several replicas and must not do the same work twice: job schedulers,
// workflow engines, reconcilers, approval gates.
//
// [New] makes a [Locker] over a [Store] (memstore embedded, redisstore,
// etcdstore, pgstore). [Locker.Do] waits its turn for a key, runs a function
// under the lease and releases it; Options.TTL sets the lease's length (renewed
// every TTL/3) and Options.OnStoreError what a store failure does.
// [Locker.Hold] and [Locker.Loop] keep a per-loop TTL hold; [Locker.TryAcquire]
// and [Locker.Acquire] return a [*Lease] to release yourself. Goroutines of one
// process contend on a local gate first, in FIFO order, so a process sends one
// store request per key, not one per goroutine.
//
// # Guarantees
//
// A lease carries an owner token (128 random bits; renew and release check it
// on the server, so a holder never touches another owner's lock), a fence token
// strictly greater for every acquisition of the key (pass it to the storage you
// write to, package fence), and a context cancelled with a cause the moment
// ownership can no longer be trusted: [ErrLeaseLost], [ErrLeaseAbandoned],
// [ErrLeaseExpired], [ErrMaxHoldReached], [ErrLeaseReleased],
// [ErrLockerClosed]. After MaxRenewFailures consecutive failed renewals the
// lease is abandoned, and a local guard on the holder's monotonic clock ends it
// before the store expires the key. Acquire and Do wait in a FIFO queue per key
// kept in the store, fair across processes. [ErrNotAcquired] means the store
// showed another owner; no answer is a store failure ([ErrStore]): [FailClosed]
// (the default) returns it, [FailOpen] returns a degraded, local-only lease
// (fence 0) on an outage ([ErrUnavailable]) only.
//
// # What is not guaranteed
//
// A lease is not a mutex: a process can pause (GC, swap, SIGSTOP) past its TTL
// between checking its lease and writing; only storage that checks the fence
// rejects that write. The local guard assumes the holder's and the store's
// clocks run at the same rate (within DriftMargin over one TTL), not that they
// agree on the time. Under FailOpen, replicas can run the same work. A store
// that loses acknowledged writes (Redis failover to a lagging replica) can give
// one key two owners; fenced writes stay safe. Use etcdstore where the lock
// itself must survive that. Reference: docs/guide.md.
package leasehold
