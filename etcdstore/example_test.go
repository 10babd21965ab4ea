package etcdstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/etcdstore"
)

// A Locker over an etcd cluster. The fence is the key's revision, so it
// survives a leader change.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, err := etcdstore.Open(ctx, []string{"10.0.0.5:2379", "10.0.0.6:2379", "10.0.0.7:2379"}, etcdstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close() // after the locker: the locker releases its leases first

	locker, err := leasehold.New(store, leasehold.Options{Name: "migrations", TTL: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	err = locker.Do(ctx, "schema:migrate", func(ctx context.Context, lease *leasehold.Lease) error {
		fmt.Println("migrating with fence", lease.Fence())
		return nil
	})
	if err != nil {
		log.Print(err)
	}
}
