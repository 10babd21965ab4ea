// Package redisstore is the Redis lock store for leasehold, over go-redis v9:
// a single node, Sentinel (a failover *redis.Client), or a Cluster.
//
// [New] wraps a go-redis client built with ContextTimeoutEnabled: true (New
// refuses one without it), so that the Locker's deadlines bound every call on
// a dead connection; go-redis otherwise waits for its own ReadTimeout.
// Options.Prefix (default "leasehold:") starts every key and channel;
// Options.Functions calls the scripts from a Functions library an operator
// loaded, so the service needs no +eval. Pass a Sentinel failover client's
// options through [TuneFailover], so that it leaves a sentinel it can no
// longer reach. Close stops the store's subscriptions; it releases no lock
// (the Locker's Close does) and does not close the client.
//
// # Guarantees
//
// Acquire, Renew and Release are one script round trip each. Acquire retried
// with the same token returns the same fence; Release answers
// [driver.ErrNotOwned] only when another token holds the key. Everything of
// one key shares a Cluster hash tag, so one script touches it all. A fence is
// max(last+1, Redis TIME in µs): strictly increasing while the key's counter
// exists, and still increasing after a restart without persistence, a
// failover or the counter's expiry, as long as the clock of the Redis server
// that answers does not step back. Waiters queue per key in FIFO order; a
// release grants the key to the head waiter in the same script and wakes only
// that waiter. Only an outage wraps [driver.ErrUnavailable] (the one error
// a FailOpen Locker fails open on); wrong passwords and ACL refusals wrap
// [driver.ErrAccessDenied], everything else [driver.ErrMisconfigured].
//
// # What is not guaranteed
//
// Redis replication is asynchronous: after a failover the new primary may not
// have a lock that the old one granted, so two holders can overlap until the
// first one's context ends. Fences (package fence) make the storage reject the
// stale holder's writes; the lock alone does not. A server with maxmemory and
// an evicting policy can evict a held lock ([ErrEvicted]). Expiry publishes
// nothing, and a wake-up published while a notification connection
// reconnects is lost (every waiter is woken when it is back).
//
// README.md: key layout, redis-cli runbook, ACLs, TLS and eviction.
package redisstore
