// Package etcdstore is a leasehold.Store on etcd v3, for locks that must stay
// correct through failures: every lock is a key written by a consensus
// (raft) transaction and attached to an etcd lease that expires it.
//
// # Layout
//
// With the prefix P (Options.Prefix, default "leasehold/"):
//
//   - the lock on key K is the etcd key P+K. Its value is the owner token, a
//     NUL byte, the lock's TTL in milliseconds, a NUL byte and the holder's
//     identity, and, for a lock that was handed over by overwriting the
//     key (a release's grant or a takeover), a NUL byte and the fence in
//     decimal. Otherwise the key's create revision is the fence.
//   - a waiter with token T queued for K is the etcd key P+K+"\x00"+T, its
//     value the waiter's identity, a NUL byte and the TTL in milliseconds a
//     release grants it (its requested TTL capped at its queue TTL). The
//     queue order is the entries' create revisions. Keys and tokens cannot
//     contain NUL, so the range [P+K, P+K+"\x01") is exactly the lock of K
//     and its queue.
//
// `etcdctl get --prefix leasehold/K -w json` shows the lock and its queue,
// and `etcdctl lease timetolive ID` the time left on a lease.
//
// # Expiry is etcd's
//
// No lease is ever kept alive. Every write of a lock, permit or queue entry
// (Acquire, Renew, a waiter's refresh) puts it on the store's current lease
// for its TTL class: a lease granted for the TTL rounded up to whole seconds
// plus one, used while it still has more than the write's TTL left (about a
// second), then replaced by a new grant. A key whose owner stops writing it
// is deleted by etcd when its lease runs out: at least its TTL and at most
// its TTL rounded up plus one second (plus etcd's 500 ms expiry check) after
// the last write, whatever this process remembers or forgets. Release
// deletes the key; Close revokes the leases that may still live. An
// uncontended Acquire and Release are one transaction each, plus one
// LeaseGrant per TTL class and second; Renew is one transaction (a write).
//
// # Takeover at the holder's TTL
//
// etcd may expire a crashed holder's lock up to 1.5 s after its TTL, so the
// head of the queue ends it itself. Each waiting Acquire (and the key's
// watch) records the lock's mod revision and TTL, and when this store first
// saw that revision with the waiter's entry at the same create revision. Every
// renewal writes the lock, which moves its mod revision; so when the head has
// seen one mod revision for the lock's whole TTL, the holder's own expiry
// guard (TTL minus its drift margin, from before it sent its last renewal)
// has stopped trusting the lock. The head's Acquire then overwrites the lock
// in a transaction guarded by that mod revision, its own entry and its place
// at the head (fence: that mod revision plus one, in the value). Clock
// assumption: the holder's and the waiters' clocks run at the same rate
// within the holder's drift margin over a TTL; their offsets do not matter.
//
// # Operations
//
//   - Acquire is one transaction: if the lock holds our token (a retry
//     after a lost reply) it moves to the current lease, same fence; else,
//     if the lock key does not exist and the queue is empty or our entry is
//     its oldest, the lock is created and our entry deleted; else the lock
//     and queue are read and, for a waiting acquire (QueueTTL > 0), our
//     entry is written. A token this store does not know it sent gets the
//     transaction without the retry check, and is asked again with it when
//     the answer shows the lock holding the token.
//   - The fence is the lock key's create revision, or the fence in its
//     value for a lock written over another one: the overwritten lock's
//     mod revision plus one, above all earlier fences of the key and at
//     most the overwriting transaction's revision.
//   - Release deletes the lock if it holds the token and nobody waits, and
//     the token's queue entry when this store queued it. When someone
//     waits it hands the key to the head of the queue (leasehold.Granter):
//     the lock is overwritten with the head's token, holder and TTL, on the
//     head's entry's lease, and the head's entry deleted, guarded by the
//     lock's mod revision and the entry still heading the queue. The head's
//     WaitRelease watch sees its token on the lock, and its Locker takes the
//     lease without an acquire (Granted).
//   - WaitRelease watches the key's range from the revision of the waiter's
//     last Acquire answer and wakes the waiter only when the lock is free and
//     no older queue entry is left, when a release granted it the key, or
//     when the lock it waits for reached its TTL unchanged (the takeover).
//
// # Semaphores
//
// A permit (AcquirePermit; keys under SemaphorePrefix) is a holder key on the
// current lease of its TTL, as a lock, and so is a waiter's queue entry (its
// refresh moves it to the current lease of the queue TTL). A waiter whose
// turn comes takes over holders it saw unchanged for their TTL, as for locks.
//
// Errors: a request that gets no answer within Options.RequestTimeout fails
// with ErrUnavailable (a store failure, never contention); etcd's auth and
// permission errors wrap leasehold.ErrMisconfigured; List skips locks it
// cannot decode and reports them with leasehold.ErrBadEntry.
//
// Not guaranteed: fences keep growing only while the cluster keeps its
// revision history. Restoring an old snapshot, or rebuilding the cluster from
// empty data directories, starts revisions lower; restore with
// `etcdutl snapshot restore --bump-revision N --mark-compacted` to keep them
// growing.
//
// A Store is safe for concurrent use. It runs one goroutine per key watch
// (WaitRelease subscriptions); Close ends them.
package etcdstore
