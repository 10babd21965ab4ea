package leasehold_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
)

func ExampleLocker_TryAcquire() {
	ctx := context.Background()
	store := memstore.New()
	replicaA, _ := leasehold.New(store, leasehold.Options{Name: "scheduler", TTL: 60 * time.Second})
	replicaB, _ := leasehold.New(store, leasehold.Options{Name: "scheduler", TTL: 60 * time.Second})
	defer replicaA.Close()
	defer replicaB.Close()

	lease, err := replicaA.TryAcquire(ctx, "scheduler:job:42")
	if err != nil {
		fmt.Println("A:", err)
		return
	}
	fmt.Println("A holds", lease.Key(), "with a fence:", lease.Fence() > 0)

	_, err = replicaB.TryAcquire(ctx, "scheduler:job:42")
	fmt.Println("B contended:", errors.Is(err, leasehold.ErrNotAcquired))

	if err := lease.Release(ctx); err != nil {
		fmt.Println("release:", err)
	}
	fmt.Println("A's context ends with:", context.Cause(lease.Context()))
	// Output:
	// A holds scheduler:job:42 with a fence: true
	// B contended: true
	// A's context ends with: leasehold: lease released
}

func ExampleLocker_Do() {
	ctx := context.Background()
	store := memstore.New()
	locker, _ := leasehold.New(store, leasehold.Options{Name: "workflow", TTL: 30 * time.Second})
	defer locker.Close()

	err := locker.Do(ctx, "workflow:run:7", func(ctx context.Context, lease *leasehold.Lease) error {
		// ctx is cancelled if the lease is lost, abandoned or expires locally:
		// pass it to every call, and lease.Fence() to every fenced write.
		fmt.Println("running run 7 under the lease")
		return nil
	})
	fmt.Println("done:", err)
	_, err = store.Inspect(ctx, "workflow:run:7")
	fmt.Println("released:", errors.Is(err, leasehold.ErrNotHeld))
	// Output:
	// running run 7 under the lease
	// done: <nil>
	// released: true
}

func ExampleLocker_Hold() {
	ctx := context.Background()
	store := memstore.New()
	locker, _ := leasehold.New(store, leasehold.Options{Name: "reconciler"})
	defer locker.Close()

	// A reconciler polling every 50 ms holds its key for 2 × 50 ms and never
	// releases it: expiry rotates ownership if this replica dies.
	lease, err := locker.Hold(ctx, "reconciler:nodes", 100*time.Millisecond)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("reconciling as the holder")
	<-lease.Done()
	fmt.Println("hold ended:", context.Cause(lease.Context()))
	// Output:
	// reconciling as the holder
	// hold ended: leasehold: lease expired locally
}

func ExampleOptions_failOpen() {
	ctx := context.Background()
	store := memstore.New()
	cleanup, _ := leasehold.New(store, leasehold.Options{
		Name:         "cleanup",
		OnStoreError: leasehold.FailOpen, // duplicates are cheap here
		Logger:       discardLogger(),
	})
	defer cleanup.Close()

	store.SetDown(true) // the lock store is sick
	lease, err := cleanup.TryAcquire(ctx, "cleanup:tmp")
	fmt.Println(err, lease.Degraded(), lease.Fence())
	_ = lease.Release(ctx)
	// Output:
	// <nil> true 0
}
