package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/redisstore"
)

// A Locker over Redis. For a Cluster pass a *redis.ClusterClient (or
// redis.NewUniversalClient with several addresses) instead.
func Example() {
	client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: "127.0.0.1:6379"})
	defer client.Close()
	store, err := redisstore.New(client, redisstore.Options{Prefix: "leasehold:"})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close() // before the client: stops the shared subscription

	locker, err := leasehold.New(store, leasehold.Options{Name: "workflow", TTL: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = locker.Do(ctx, "workflow:run:42", func(ctx context.Context, lease *leasehold.Lease) error {
		fmt.Println("running with fence", lease.Fence())
		return nil
	})
	if err != nil {
		log.Print(err)
	}
}
