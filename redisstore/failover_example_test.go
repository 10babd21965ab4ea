package redisstore_test

import (
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/redisstore"
)

// A Locker on a Sentinel group: the failover client's options go through
// TuneFailover, so that a client whose sentinel is partitioned away asks
// another one for the new master.
func ExampleTuneFailover() {
	c := redis.NewFailoverClient(redisstore.TuneFailover(&redis.FailoverOptions{
		MasterName:            "mymaster",
		SentinelAddrs:         []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"},
		DialTimeout:           time.Second,
		ContextTimeoutEnabled: true,
	}))
	defer c.Close()
	store, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	locker, err := leasehold.New(store, leasehold.Options{TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
}
