package redisstore

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// TuneFailover adjusts the options of a go-redis failover client (Redis
// Sentinel) so that the client stops asking a sentinel it can no longer
// reach, and returns o. Call it before redis.NewFailoverClient.
//
// go-redis's failover client keeps one sentinel (the first that answered,
// from a shuffled list), asks it for the master's address on every new
// connection, and listens on it for +switch-master. Each ask is bounded by
// the dial's own deadline (DialTimeout). When that sentinel is partitioned
// away (its packets dropped, not refused), the ask fails by that deadline,
// and go-redis then keeps the sentinel, taking the failure for the
// caller's: it dials no other sentinel, never hears +switch-master, and
// keeps failing until its sentinel connection pool has counted PoolSize
// failed dials (about 12 s with DialTimeout 500 ms) or for good. It drops
// the sentinel only when the ask fails before the deadline.
//
// So TuneFailover makes the ask fail first: it turns off go-redis's command
// retries (MaxRetries -1 when unset; a retry would dial the unreachable
// sentinel again, which hangs until the deadline; the Locker retries on its
// own) and keeps ReadTimeout below DialTimeout: an unset ReadTimeout
// (go-redis v9.22's default is 5 s, as is DialTimeout's) becomes half of
// DialTimeout when 5 s would not be below it, so does a negative one (no
// timeout), and a ReadTimeout set at or above DialTimeout raises
// DialTimeout to twice ReadTimeout. The client then moves to a reachable sentinel about one
// DialTimeout after its first dial that needed one.
func TuneFailover(o *redis.FailoverOptions) *redis.FailoverOptions {
	const (
		goRedisDial = 5 * time.Second // go-redis's default DialTimeout
		goRedisRead = 5 * time.Second // and ReadTimeout (v9.22)
	)
	if o.MaxRetries == 0 {
		o.MaxRetries = -1
	}
	dial := o.DialTimeout
	if dial <= 0 {
		dial = goRedisDial
	}
	switch {
	case o.ReadTimeout < 0 || o.ReadTimeout == 0 && goRedisRead >= dial:
		o.ReadTimeout = dial / 2
	case o.ReadTimeout >= dial:
		o.DialTimeout = 2 * o.ReadTimeout
	}
	return o
}
