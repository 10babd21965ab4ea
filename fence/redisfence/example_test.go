package redisfence_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/redisfence"
	"github.com/leasehold/leasehold/redisstore"
)

// A holder writes its result to Redis through the fence: a write whose
// lease was taken over meanwhile (a pause longer than the TTL) is refused
// by the resource, not by the holder's belief.
func ExampleRedis() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: "redis.internal:6379"})
	defer client.Close()
	store, err := redisstore.New(client, redisstore.Options{})
	if err != nil {
		panic(err)
	}
	results, err := redisfence.NewRedis(client, redisfence.RedisOptions{Name: "scheduler"})
	if err != nil {
		panic(err)
	}
	locker, err := leasehold.New(store, leasehold.Options{Name: "scheduler"})
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	err = locker.Do(ctx, "scheduler:job:42", func(ctx context.Context, lease *leasehold.Lease) error {
		// ... the work ...
		return fence.Write(ctx, results, lease, "results:job:42", []byte(`{"state":"done"}`))
	})
	if errors.Is(err, fence.ErrStaleFence) {
		fmt.Println("a newer holder owns job 42; dropping this result")
	}
}
