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
//     key (a release's grant or a takeover, below), a NUL byte and the
//     fence in decimal. Otherwise the key's create revision is the fence.
//   - a waiter with token T queued for K is the etcd key P+K+"\x00"+T, its
//     value the waiter's identity, a NUL byte and the TTL in milliseconds a
//     release grants it (its requested TTL capped at its queue TTL). The
//     queue order is the entries' create revisions. Keys and tokens cannot contain NUL, so the range
//     [P+K, P+K+"\x01") is exactly the lock of K and its queue.
//
// `etcdctl get --prefix leasehold/K -w json` shows the lock and its queue,
// and `etcdctl lease timetolive ID` the time left on a lease.
//
// # One lease per store and TTL
//
// Like an etcd concurrency.Session, a Store grants one etcd lease per lock
// TTL (in whole seconds), for that TTL plus one second, and keeps it alive
// every 300 ms from one background goroutine. Every lock and queue entry of
// the store with that TTL is attached to it. So Acquire and Release are one
// transaction each (two requests and two raft entries per uncontended
// cycle), with no LeaseGrant or LeaseRevoke per lock; Renew is one
// linearizable read (no raft entry): the lease is known to live beyond
// now+TTL, or Renew sends a keep-alive first. Close revokes the store's
// leases, which deletes whatever locks and queue entries are still attached;
// a lease that no lock used for 10 s is revoked too.
//
// What bounds a lock whose holder stopped renewing it while other locks
// keep the shared lease alive: the store remembers the deadline of every
// lock it wrote (its TTL after the reply to its last Acquire or Renew,
// always later than the holder's own expiry guard) and deletes the lock,
// token-checked, when the deadline passes (within 50 ms). A Renew that
// races with that deletion answers ErrNotOwned. Queue entries get the same
// treatment with the queue TTL. When the store's process dies, hangs or
// loses etcd, nobody keeps the lease alive, and etcd deletes everything on
// it at most TTL+1 s after the last keep-alive (plus etcd's 500 ms expiry
// check), unless a waiter takes the lock over first (below).
//
// # Takeover at the holder's TTL
//
// A crashed holder's shared lease outlives its lock's TTL by up to 1.5 s, and a
// lease cannot end sooner without a keep-alive per lock. So the head of the
// queue ends the lock itself. Each waiting Acquire records the lock's mod
// revision and TTL as it saw them, and when it first saw that revision (with
// its own queue entry at the same create revision), on the waiter's monotonic
// clock, after the answer arrived. A holder's Renew writes the lock whenever
// its read shows a waiter, which moves the mod revision; a renewal that read an
// empty queue came before any waiter saw the lock. So when the head has seen
// one mod revision for the lock's whole TTL, every renewal of the holder
// started more than a TTL ago, and the holder's own expiry guard (TTL minus its
// drift margin, from before it sent the request) has stopped trusting the lock.
// The Grant's Remaining tells the head when that is, 1.5 ms early (counted from
// when its acquire was sent), and its watch wakes it as early: Go's timers fire
// up to a millisecond late in an idle process. An Acquire that comes up to 2 ms
// early waits for the moment itself, spinning through the last 1.5 ms, rather
// than send a transaction etcd would refuse, or send it late. Its Acquire then
// deletes the lock in a transaction guarded by that mod revision, its own entry
// and its place at the head, and overwrites it with its own lock (fence: that
// mod revision plus one, in the value): one transaction, about the holder's TTL
// after its last renewal. Clock assumption: the holder's and the waiters'
// clocks run at the same rate within the holder's drift margin over a TTL (a
// Locker's DriftMargin, by default TTL/20 + 5 ms); their offsets do not matter.
// The price: a renewal of a lock that others wait for is one read and one
// write.
//
// # Operations
//
//   - Acquire is one transaction: if the lock holds our token (a retry
//     after a lost reply) it stays, with the same fence (moved to the lease
//     of the new TTL); else, if the lock key does not exist and the queue is
//     empty or our entry is its oldest, the lock is created and our entry
//     deleted; else the lock and queue are read and, for a waiting acquire
//     (QueueTTL > 0), our entry is created if absent. A TryAcquire that
//     loses reads the holder's lease's time to live (one more request).
//     The first acquire of a token this store never sent leaves out the
//     retry check (such a token cannot hold the lock) and puts its entry
//     without the absence check: a request without nested transactions,
//     which etcd decodes, logs and applies faster. If its answer shows the
//     lock holding the token after all (a retry through another Store), the
//     store asks again with the retry check. A waiting acquire of a token
//     whose entry waits behind another one, while another token holds the
//     lock, as the key's watch shows them (the Locker's refresh of its
//     place, every WaiterTTL/3), sends nothing: the store moves its own
//     deadline for the entry, so a waiter costs etcd no write until it
//     heads the queue.
//   - The fence is the lock key's create revision, or the fence in its
//     value for a lock written over another one (a grant or a takeover): the
//     overwritten lock's mod revision plus one. Every fence of a key was
//     given by a write of the key, so it is at most the key's mod revision
//     at any later time; mod+1 is thus above all earlier fences, and at most
//     the overwriting transaction's revision, below every later create
//     revision. A retry with the same token reports the same fence (it
//     keeps the value, and rewrites it only for a new TTL).
//   - Renew reads the lock and its waiter count and checks the token and
//     lease (see above); it writes the lock when someone waits.
//   - Concurrent uncontended releases of one store share requests: while
//     two are in flight, the next ones queue and go together as one
//     transaction with a nested transaction (and comparison) per lock when
//     one of those returns. One goroutine never waits; at 16 goroutines a
//     cycle costs about 1.3 requests instead of 2. A release sent for
//     others is bounded by RequestTimeout, not by its caller's context.
//   - Release deletes the lock if it holds the token and nobody waits, and
//     the token's queue entry in any case, in one transaction; it answers
//     ErrNotHeld when the lock is gone and ErrNotOwned when another token
//     holds it. When someone waits it hands the key to the head of the
//     queue (leasehold.Granter): the lock is overwritten with the head's
//     token, holder and TTL, on the head's queue lease, and the head's entry
//     deleted, guarded by the lock's mod revision and the entry still
//     heading the queue. A holder that took the key from the queue (or by a
//     grant) knows the next head from that answer (or its watch), and its
//     release is that one transaction; otherwise the release reads the head
//     (no write) and a second transaction grants. The head's WaitRelease
//     watch sees its token on the lock, and its Locker takes the lease
//     without an acquire (Granted); a grant nobody takes is deleted with
//     the waiter's queue entry at its queue TTL.
//   - WaitRelease watches the key's range from the revision of the waiter's
//     last Acquire answer and wakes the waiter only when the lock is free
//     and no older queue entry is left, or when a release granted it the
//     key: the head of the queue, alone. An expiry deletes the lock key; the
//     head of a crashed holder's queue does not wait for that: it retries at
//     the lock's TTL and takes it over (above). Since the watch starts at the
//     waiter's last answer, the waiter needs no acquire right after
//     subscribing (leasehold.Resumer).
//
// TTLs are whole seconds on the server: a lease's TTL is the lock's TTL
// rounded up plus one second, and etcd raises TTLs below its minimum (1.5 ×
// election timeout, rounded up; 2 s with default settings). While the store
// runs, a lock nobody renews is deleted at its TTL by the store itself, and
// a waiter deletes a crashed holder's lock at its TTL (above).
// Etcd's leader checks for expired leases every 500 ms, and a newly elected
// leader extends every lease by its full TTL.
//
// # Semaphores
//
// A permit (AcquirePermit; keys under SemaphorePrefix) is a holder key on
// the same shared lease as the store's locks of its TTL, so an uncontended
// AcquirePermit and ReleasePermit are one transaction each, as for a lock
// (the store's bound of the semaphore spares the read, see semBounds).
// The store tracks each permit's deadline like a lock's and deletes the
// holder key, token by token, when the deadline passes unrenewed; the
// holder's next RenewPermit (one read) then answers ErrNotOwned. When the
// store's process dies, its permits go with the shared lease, at most
// TTL+1 s (plus etcd's 500 ms check) after its last keep-alive, unless a
// waiter takes them over first, at their TTL, the way the head of a lock's
// queue does (above): a renewal whose read counts a waiter writes the
// holder key (a new mod revision); a waiter records each holder's mod
// revision and when it first saw it while its own queue entry existed (its
// join's transaction reads the holders; its acquires and its WaitPermit
// watch see later writes), and when holders it saw unchanged for their TTL
// free its turn, its grant's transaction deletes them, guarded by their mod
// revisions and its entry. Same clock assumption as for locks; a renewal
// of a permit that others wait for is one read and one write. Waiters are
// queue entries on their own lease of the queue TTL.
//
// Every grant and new waiter rewrites the semaphore's guard key, and a
// grant's transaction requires the guard unchanged since its read: nothing
// joined in between. The guard lives on its last writer's lease, so a read
// can find none, and a guard written and then expired before the
// transaction (a grant, then a waiter whose lease ran out) would compare
// equal to "absent" again; so a read without a guard also requires every
// holder and waiter key to be no newer than the read.
//
// Errors (errors.go, one classification): a request that gets no answer
// within Options.RequestTimeout, a refused or reset connection, gRPC
// Unavailable or DeadlineExceeded and etcd's no-leader and timeout answers
// are outages (ErrUnavailable, which matches leasehold.ErrUnavailable: the
// only errors a FailOpen Locker fails open on); auth and permission errors
// wrap leasehold.ErrAccessDenied; everything else, TLS handshake failures
// (gRPC reports them as Unavailable; Open probes the handshake when its
// first read times out), a TTL above etcd's maximum and any unclassified
// error, wraps leasehold.ErrMisconfigured. List skips locks it cannot decode
// and reports them with leasehold.ErrBadEntry.
//
// Not guaranteed: fences keep growing only while the cluster keeps its
// revision history. Restoring an old snapshot, or rebuilding the cluster from
// empty data directories, starts revisions lower; restore with
// `etcdutl snapshot restore --bump-revision N --mark-compacted` to keep them
// growing. Locks written by an earlier version of this package (value = the
// token alone) are shown by Inspect and List but cannot be renewed or
// released by this one: they end at their lease's TTL.
//
// A Store is safe for concurrent use. It runs one background goroutine
// (keep-alives, deadlines, idle leases) and one per WaitRelease subscription;
// Close and stop end them.
package etcdstore
