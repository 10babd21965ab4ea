// Package redisstore is the Redis lock store for leasehold, over go-redis v9:
// a single node, Sentinel (a failover *redis.Client), or a Cluster.
//
// # Key layout
//
// For the lock key KEY and the default prefix "leasehold:", with TAG = KEY
// where '%', '{' and '}' are written %25, %7B and %7D (so no key can end or
// open the Cluster hash tag early; most keys are their own TAG):
//
//	leasehold:{TAG}:lock    string "TOKEN|HOLDER" ("TOKEN" with no holder);
//	                        PTTL is the remaining TTL
//	leasehold:{TAG}:fence   string: the last fence minted for KEY, a decimal
//	                        uint64 (the holder's fence while the lock exists);
//	                        expires FenceRetention (default 24 h) after the lock's TTL
//	leasehold:{TAG}:queue   hash: the FIFO waiter queue, TOKEN -> "SEQ|DEADLINE_MS|TTL_MS|WAKE|HOLDER"
//	                        ("#" -> last SEQ); expires with its last live waiter
//	leasehold:{TAG}:released string: the token of the last release that left
//	                        waiters queued, for 10 s, so a retry of that release
//	                        (its reply lost) answers nil, not ErrNotOwned
//	leasehold:{TAG}:wake    pub/sub channel (sharded on a Cluster), every
//	                        waiter: "" when a release left nobody queued
//	leasehold:{TAG}:wake:ID one per waiting process (ID in its queue entry):
//	                        the grant "TOKEN|FENCE|TTL_MS" to its head waiter
//	leasehold:{TAG}:watch   observers (besides :wake): a copy of each grant
//
// Everything of one key shares the hash tag, hence one Cluster slot, so one
// script touches it all. Runbook:
//
//	redis-cli GET  'leasehold:{scheduler:job:42}:lock'    # owner token|holder
//	redis-cli PTTL 'leasehold:{scheduler:job:42}:lock'    # remaining TTL in ms (-2: not held)
//	redis-cli GET  'leasehold:{scheduler:job:42}:fence'   # fence of the holder
//	redis-cli HGETALL 'leasehold:{scheduler:job:42}:queue' # waiters (SEQ orders them)
//	redis-cli --scan --pattern 'leasehold:{scheduler:*}:lock'  # locks under a prefix
//	redis-cli SUBSCRIBE 'leasehold:{scheduler:job:42}:watch'   # watch hand-offs
//
// Deleting the lock key by hand is the break-glass release (Store.ForceRelease
// does the same and also wakes the head waiter). Never delete a valid fence
// key while clocks are in doubt: it is what keeps fences increasing faster
// than time.
//
// # Round trips and the queue
//
// Acquire is one EVALSHA: the queue rule of leasehold.Store, SET PX of the
// lock and the fence. When no queue exists and the key is free it runs
// EXISTS, SET NX PX GET, TIME and SET PX GET, nothing more. A waiting
// acquire (QueueTTL > 0) that is refused joins the queue or refreshes its
// place; a waiter that stops refreshing drops out at its deadline. Renew
// (compare-and-PEXPIRE) and Release (compare-and-DEL, leave the queue, grant
// the key to the head) are one EVALSHA each. A release that frees a key with
// a live head waiter makes that waiter the holder in the same script (its
// token, holder and TTL, PX capped at its queue deadline, a fresh fence) and
// publishes the grant; the waiter's Locker takes its lease from the message
// (leasehold.Granter), so a contended acquisition costs the queued acquire
// and the release. A waiter that missed the message finds itself the holder
// on its next acquire. Release returns leasehold.ErrNotHeld when
// the key is gone, also when a retry finds its own earlier release applied,
// and leasehold.ErrNotOwned only when another token holds the key. Scripts
// are sent by SHA and re-sent in full on NOSCRIPT (go-redis Script.Run).
//
// # Fences and the clock assumption
//
// A fence is max(last+1, TIME in µs), where last is the key's counter and TIME
// is the Redis server's clock. The scripts compute it on decimal strings, never
// on Lua numbers (which are exact only up to 2^53). The counter makes fences
// strictly increasing while it exists; the time floor keeps them increasing
// when it is gone: after a restart without persistence, a failover to a
// replica that had not yet received it, or its expiry. This assumes that the
// wall clock of whichever Redis server answers does not step backward by more
// than the time since the last fence was minted (or than FenceRetention,
// while the counter exists): run NTP in slew mode and keep failover replicas
// on synchronised clocks.
//
// # Bad entries and configuration errors
//
// A fence key that does not hold a decimal below 2^64-1 (written by hand, or
// another program using the prefix) makes Acquire fail with an error wrapping
// leasehold.ErrBadEntry that names the Redis key; nothing is rewritten and no
// lock is left behind. To recover, delete the fence key (redis-cli DEL …:fence;
// the next fence comes from the server clock) or force-release the key, which
// deletes an unusable fence key with the lock. A lock key without expiry is
// reported the same way (delete it). List skips bad entries and reports them
// with the good ones.
//
// # Errors
//
// One classification (errors.go) decides every error: an outage wraps
// leasehold.ErrUnavailable (a refused, reset or timed-out connection, a pool
// timeout, a connection closed after the server had answered, LOADING,
// READONLY, MASTERDOWN, TRYAGAIN, CLUSTERDOWN, BUSY, NOREPLICAS), and only
// an outage lets a FailOpen Locker fail open. Wrong or missing passwords and
// ACL refusals wrap leasehold.ErrAccessDenied; everything else wraps
// leasehold.ErrMisconfigured: a TLS handshake or verification failure, a
// port that does not speak Redis (a plaintext client on a TLS port is closed
// before the server ever answers), a database number that does not exist,
// WRONGTYPE, CROSSSLOT, and any error not known to be an outage. New adds a
// hook to the client that tells a failed handshake apart from an outage. A
// TLS server that takes the connection and never answers the handshake is
// not proven down, so it fails closed too.
//
// # What is not guaranteed
//
// Redis replication is asynchronous: after a failover the new primary may not
// have a lock that the old one granted, so two holders can overlap until the
// first one's context ends. Fences (package fence) make the storage reject the
// stale holder's writes; the lock alone does not. Expiry publishes nothing: the
// head waiter wakes at the holder's remaining TTL, which its Acquire reported.
// A wake-up published while a notification connection reconnects is lost, so
// every waiter is woken when the connection is back.
//
// # Waiting
//
// WaitRelease subscribes the key's channel on the Store's notification
// connection (one for a single node, one per master on a Cluster, where
// SSUBSCRIBE reaches only the node that owns the key's slot) and returns
// once Redis confirmed it, bounded by the waiter's own context: a waiter never
// waits for another waiter's dial. A release publishes the head's grant (or
// token), and only that waiter is woken; waiters of other keys are not
// disturbed. A channel stays subscribed for 2 s after its last waiter in the
// process left, so a replica that waits on one key again and again
// subscribes once, and its next waiter subscribes before its first acquire
// (no second acquire to catch a release in between).
//
// # ACL
//
// A user restricted to the prefix needs these permissions:
//
//	ACL SETUSER leasehold on >PASSWORD resetkeys ~leasehold:* resetchannels &leasehold:* -@all +evalsha +eval +get +set +pexpire +pttl +del +exists +hgetall +hset +hdel +hincrby +publish +spublish +time +scan +subscribe +unsubscribe +ssubscribe +sunsubscribe +ping
//
// Scripts run under the caller's ACL, so the commands they call are listed
// too; &leasehold:* covers the notification channels. Cluster clients also
// need +cluster|slots +cluster|shards +readonly to discover the topology.
//
// # Eviction
//
// A Redis with maxmemory and any policy but noeviction can evict a held
// lock's key (every lock key has a TTL, so volatile-* policies take them
// first), and a second holder then acquires it while the first still runs.
// A Locker reads INFO memory once, in the background after its first
// acquisition (CheckConfig), and warns when the server can evict; a renewal
// that finds its lock gone after evicted_keys rose returns ErrEvicted beside
// leasehold.ErrNotOwned. Both need +info, which the ACL above leaves out:
// add it to let the store check, or run `leasehold doctor` as an operator.
//
// Build the go-redis client with ContextTimeoutEnabled: true (New refuses
// one without it), so that the Locker's deadlines bound every call on a dead
// connection; go-redis otherwise waits for its own ReadTimeout. Pass a Sentinel failover client's
// options through TuneFailover, so that it leaves a sentinel it can no
// longer reach.
package redisstore
