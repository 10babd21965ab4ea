// Package driver is the contract between a leasehold.Locker and a lock store,
// as database/sql/driver is for database/sql. Users of leasehold never need
// it; a store implements [Store] and, where it can, the optional interfaces
// beside it, and passes package storetest's conformance suite against its
// real server. A wrapper around a Store (a fault injector, an instrumenting
// proxy) forwards every optional interface it does not mean to hide.
//
// Every method is safe for concurrent use. [ErrNotAcquired], [ErrNotOwned]
// and [ErrNotHeld] mean the store answered. Any other error is a store
// failure: the store wraps it with [ErrUnavailable] when it is known to be an
// outage (refused or reset connection, timeout, a server loading or failing
// over) and with [ErrMisconfigured] or [ErrAccessDenied] otherwise; the Locker
// fails open only on ErrUnavailable. The root package re-exports these errors
// as the same values.
//
// # The waiter queue
//
// Every key has a FIFO queue of waiting tokens, kept in the store so that it
// spans processes. An entry lives until QueueTTL after its token's last
// waiting Acquire or [QueueRefresher] refresh, or, queued with Kept on a
// [PresenceKeeper], until the earlier of Kept after it and the end of its
// Store's presence (on some stores the presence alone); expired entries are dropped before any decision. A key
// is granted only when it is free and the queue is empty or the token is its
// head: a newcomer never overtakes a waiter.
//
// # Wake-ups and hand-offs
//
// A [Notifier]'s channel carries [Wake] values. A zero Wake means "check
// again". A store whose Release hands a free key straight to the queue head
// grants what the head asked for in its last waiting Acquire (token, Holder,
// TTL) with a fresh fence, removes the head from the queue, keeps the lock
// at least for the lesser of TTL and what was left of the entry's life (so
// at least min(TTL, QueueTTL) after that Acquire or a later refresh, and for
// an entry kept by a presence no longer than the presence), and sends the
// head a Wake with the Fence and TTL: the Locker takes the lease without a
// request. A waiter that misses the Wake finds itself the holder on its
// next Acquire; one that gives up calls Release, which frees a grant it may
// have received.
//
// For a waiter (token not empty), WaitRelease puts one zero Wake on the
// channel before it returns, unless the subscription misses no change since
// token's last waiting Acquire (etcd: the watch reads the key as of its
// start, waking token at once if it is free or granted): the Locker acquires
// again, so no release between is missed.
package driver
