package pgstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/pgstore"
)

// A Locker over PostgreSQL. Open creates the lease table and the fence
// sequence when they are missing.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, err := pgstore.Open(ctx, "postgres://app@db.internal:5432/app", pgstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close() // after the locker: the locker releases its leases first

	locker, err := leasehold.New(store, leasehold.Options{Name: "billing", TTL: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	err = locker.Do(ctx, "billing:invoice:2026-11", func(ctx context.Context, lease *leasehold.Lease) error {
		fmt.Println("invoicing with fence", lease.Fence())
		return nil
	})
	if err != nil {
		log.Print(err)
	}
}
