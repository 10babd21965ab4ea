package leasehold_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
		OnStoreError: leasehold.FailOpen,            // duplicates are cheap here
		Logger:       slog.New(slog.DiscardHandler), // in production: the service's logger
	})
	defer cleanup.Close()

	store.SetDown(true) // the lock store is sick
	lease, err := cleanup.TryAcquire(ctx, "cleanup:tmp")
	fmt.Println(err, lease.Degraded(), lease.Fence())
	_ = lease.Release(ctx)
	// Output:
	// <nil> true 0
}

// A waiting Acquire takes its place in the key's queue (kept in the store,
// so it is fair across processes) and gets the key as soon as the holder
// releases it.
func ExampleLocker_Acquire() {
	ctx := context.Background()
	store := memstore.New()
	replicaA, _ := leasehold.New(store, leasehold.Options{Identity: "replica-a"})
	replicaB, _ := leasehold.New(store, leasehold.Options{Identity: "replica-b"})
	defer replicaA.Close()
	defer replicaB.Close()

	held, _ := replicaA.TryAcquire(ctx, "report")
	got := make(chan *leasehold.Lease)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		lease, err := replicaB.Acquire(ctx, "report") // waits in the queue
		if err != nil {
			fmt.Println(err)
		}
		got <- lease
	}()
	for {
		if info, _ := store.Inspect(ctx, "report"); info.Waiting == 1 {
			fmt.Println("held by", info.Holder, "next:", info.NextHolder)
			break
		}
		time.Sleep(time.Millisecond)
	}
	_ = held.Release(ctx) // hands the key to the head of the queue
	lease := <-got
	info, _ := store.Inspect(ctx, "report")
	fmt.Println("now held by", info.Holder, "with a higher fence:", lease.Fence() > held.Fence())
	_ = lease.Release(ctx)
	// Output:
	// held by replica-a next: replica-b
	// now held by replica-b with a higher fence: true
}

// TryOnce makes Do skip work that another replica is already doing.
func ExampleDoOptions_tryOnce() {
	ctx := context.Background()
	store := memstore.New()
	other, _ := leasehold.New(store, leasehold.Options{})
	locker, _ := leasehold.New(store, leasehold.Options{})
	defer other.Close()
	defer locker.Close()

	busy, _ := other.TryAcquire(ctx, "cleanup")
	defer busy.Release(ctx)
	err := locker.Do(ctx, "cleanup", func(ctx context.Context, lease *leasehold.Lease) error {
		fmt.Println("cleaning up")
		return nil
	}, leasehold.DoOptions{TryOnce: true})
	fmt.Println("skipped:", errors.Is(err, leasehold.ErrNotAcquired))
	// Output:
	// skipped: true
}

// WaitTimeout bounds how long Do waits for the key, not how long the work
// may take.
func ExampleDoOptions_waitTimeout() {
	ctx := context.Background()
	store := memstore.New()
	other, _ := leasehold.New(store, leasehold.Options{})
	locker, _ := leasehold.New(store, leasehold.Options{})
	defer other.Close()
	defer locker.Close()

	busy, _ := other.TryAcquire(ctx, "nightly")
	defer busy.Release(ctx)
	err := locker.Do(ctx, "nightly", func(ctx context.Context, lease *leasehold.Lease) error {
		return nil
	}, leasehold.DoOptions{WaitTimeout: 50 * time.Millisecond})
	fmt.Println(err)
	fmt.Println(errors.Is(err, leasehold.ErrNotAcquired), errors.Is(err, context.DeadlineExceeded))
	// Output:
	// leasehold: not acquired: "nightly": gave up waiting: context deadline exceeded
	// true true
}

// Budget is the arithmetic behind the renewal failure budget: with the
// defaults, the attempts fit before the local expiry guard, so a lease whose
// renewals keep failing is abandoned (ErrLeaseAbandoned) rather than expired.
func ExampleOptions_Budget() {
	b, _ := leasehold.Options{TTL: 30 * time.Second}.Budget()
	fmt.Println("renew every", b.RenewInterval, "with a", b.RenewTimeout, "timeout")
	fmt.Println("3 failed attempts end by", b.Need(), "- the guard fires at", b.Have())
	fmt.Println("fits:", b.Fits())
	// Output:
	// renew every 10s with a 2s timeout
	// 3 failed attempts end by 16.02s - the guard fires at 28.495s
	// fits: true
}

// An election on the embedded store: the first candidate leads, and its
// leadership is a lease with a fence for the writes it makes.
func ExampleElection() {
	ctx := context.Background()
	locker, err := leasehold.New(memstore.New(), leasehold.Options{Name: "reconciler", Identity: "replica-a"})
	if err != nil {
		panic(err)
	}
	defer locker.Close()
	el, err := leasehold.NewElection(locker, "reconciler:leader", leasehold.Callbacks{})
	if err != nil {
		panic(err)
	}
	lease, err := el.Campaign(ctx)
	if err != nil {
		panic(err)
	}
	leader, err := el.Leader(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("leader:", leader.Holder, "fenced:", leader.Fence == lease.Fence())
	if err := el.Resign(ctx); err != nil {
		panic(err)
	}
	leader, _ = el.Leader(ctx)
	fmt.Println("vacant after resigning:", leader.Vacant())
	// Output:
	// leader: replica-a fenced: true
	// vacant after resigning: true
}

func ExampleSemaphore() {
	ctx := context.Background()
	store := memstore.New()
	lk, _ := leasehold.New(store, leasehold.Options{Name: "runs", TTL: 30 * time.Second})
	defer lk.Close()

	// At most two concurrent runs for tenant 7, across every replica that
	// uses the same key and limit.
	sem, err := lk.Semaphore("tenant:7:runs", 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	first, _ := sem.TryAcquire(ctx)
	second, _ := sem.TryAcquire(ctx)
	fmt.Println("two permits, fences increase:", second.Fence() > first.Fence())

	_, err = sem.TryAcquire(ctx)
	fmt.Println("third contended:", errors.Is(err, leasehold.ErrNotAcquired))

	_ = first.Release(ctx)
	err = sem.Do(ctx, func(ctx context.Context, permit *leasehold.Lease) error {
		// permit is a full lease: renewed automatically, ctx ends if it is lost.
		fmt.Println("run with fence above both:", permit.Fence() > second.Fence())
		return nil
	})
	fmt.Println("Do:", err)
	// Output:
	// two permits, fences increase: true
	// third contended: true
	// run with fence above both: true
	// Do: <nil>
}
