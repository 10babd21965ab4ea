// Package leasehold provides distributed leases for Go services that run as
// several replicas and must not do the same work twice.
//
// [New] makes a [Locker] over a store (memstore, redisstore, etcdstore,
// pgstore; the contract is package driver). [Locker.Do] waits its turn for a
// key in a FIFO queue kept in the store, runs a function under the lease and
// releases it; [Locker.Loop] runs a reconciler on the replica that holds a
// key; [Election] and [Semaphore] build on the same leases.
//
// # Guarantees
//
// A lease has an owner token that renew and release check on the server, a
// fence token greater for every acquisition of the key (check it where you
// write: package fence), and a context cancelled with a cause
// ([ErrLeaseLost], [ErrLeaseAbandoned], [ErrLeaseExpired], ...) the moment
// ownership can no longer be trusted, before the store expires the key.
// [ErrNotAcquired] means the store showed another owner; a store failure is
// [ErrStore], which [FailClosed] (the default) returns and [FailOpen] turns
// into a degraded, local-only lease on an outage only.
//
// # What is not guaranteed
//
// A lease is not a mutex: a process paused past its TTL between checking its
// lease and writing can still write; only storage that checks the fence
// rejects it. The local guard assumes clocks run at the same rate (within
// DriftMargin per TTL). Under FailOpen, replicas can run the same work. A
// store that loses acknowledged writes (Redis failover to a lagging replica)
// can give a key two owners; fenced writes stay safe. Reference:
// docs/guide.md.
package leasehold
