// Package redisstore is the Redis lock store for leasehold, over go-redis v9:
// a single node, Sentinel (a failover *redis.Client), or a Cluster.
//
// # Key layout
//
// For the lock key KEY and the default prefix "leasehold:":
//
//	leasehold:{KEY}:lock    string: the owner token; PTTL is the remaining TTL
//	leasehold:{KEY}:fence   string: the last fence minted for KEY (the holder's
//	                        fence while the lock exists); expires FenceRetention
//	                        (default 24 h) after the lock's TTL
//	leasehold:released      pub/sub channel: every release publishes KEY
//
// The braces are a Redis Cluster hash tag, so a key's lock and fence counter
// live in the same slot and one script can touch both. Runbook:
//
//	redis-cli GET  'leasehold:{scheduler:job:42}:lock'    # owner token
//	redis-cli PTTL 'leasehold:{scheduler:job:42}:lock'    # remaining TTL in ms (-2: not held)
//	redis-cli GET  'leasehold:{scheduler:job:42}:fence'   # fence of the holder
//	redis-cli --scan --pattern 'leasehold:{scheduler:*}:lock'  # locks under a prefix
//	redis-cli SUBSCRIBE leasehold:released                # watch releases
//
// Deleting the lock key by hand is the break-glass release (Store.ForceRelease
// does the same and also wakes waiters). Never delete the fence key while
// clocks are in doubt: it is what keeps fences increasing faster than time.
//
// # Round trips
//
// Acquire is one EVALSHA: SET NX PX plus the fence. Renew (compare-and-
// PEXPIRE) and Release (compare-and-DEL, then PUBLISH) are one EVALSHA each.
// Scripts are sent by SHA and re-sent in full on NOSCRIPT (go-redis
// Script.Run). An Acquire retried with the same token after a lost reply finds
// its own token, extends the TTL and returns the same fence.
//
// # Fences and the clock assumption
//
// A fence is max(last+1, TIME in µs), where last is the key's counter and TIME
// is the Redis server's clock. The counter makes fences strictly increasing
// while it exists; the time floor keeps them increasing when it is gone: after
// a restart without persistence, a failover to a replica that had not yet
// received it, or its expiry. This assumes that the wall clock of whichever
// Redis server answers does not step backward by more than the time since the
// last fence was minted (or than FenceRetention, while the counter exists):
// run NTP in slew mode and keep failover replicas on synchronised clocks. A
// fence is about 1.7e15 today and fits in float64 (Redis Lua numbers) until
// the year 2255.
//
// # What is not guaranteed
//
// Redis replication is asynchronous: after a failover the new primary may not
// have a lock that the old one granted, so two holders can overlap until the
// first one's context ends. Fences (package fence) make the storage reject the
// stale holder's writes; the lock alone does not. Release notifications are
// best effort: one published while the store's subscription reconnects is
// lost, and a waiter then wakes when the holder's TTL runs out. Expiry
// publishes nothing. On a Cluster, PUBLISH is broadcast to every node.
//
// # Waiting
//
// A Store keeps one pub/sub connection, opened by the first WaitRelease and
// closed by Close, and hands each released key to that key's waiters: a
// thousand waiters cost one connection.
//
// # ACL
//
// A user restricted to the prefix needs these permissions:
//
//	ACL SETUSER leasehold on >PASSWORD resetkeys ~leasehold:* resetchannels &leasehold:* -@all +evalsha +eval +get +set +pexpire +pttl +del +exists +hgetall +hset +hdel +hincrby +publish +spublish +time +scan +subscribe +unsubscribe +ssubscribe +sunsubscribe +ping
//
// Scripts run under the caller's ACL, so the commands they call are listed
// too; &leasehold:* covers the notification channel. Cluster clients also
// need +cluster|slots +cluster|shards +readonly to discover the topology.
//
// Build the go-redis client with ContextTimeoutEnabled: true, so that the
// Locker's renew and release timeouts bound every call on a dead connection;
// go-redis otherwise waits for its own ReadTimeout.
package redisstore
