package fence_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/memstore"
)

// A holder writes under its lease; the next holder writes; the first holder,
// paused until after the takeover, wakes up and its write is rejected.
func Example() {
	ctx := context.Background()
	locker, err := leasehold.New(memstore.New(), leasehold.Options{Name: "approval"})
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	reg := fence.NewRegister(fence.RegisterOptions{
		Name: "approval",
		Observer: leasehold.ObserverFunc(func(e leasehold.Event) {
			fmt.Printf("observed %s on %s (locker %s)\n", e.Kind, e.Op, e.Locker)
		}),
	})

	var fenceA uint64
	err = locker.Do(ctx, "approval:req:42", func(ctx context.Context, lease *leasehold.Lease) error {
		fenceA = lease.Fence()
		return fence.Write(ctx, reg, lease, "req:42", []byte("approved by A"))
	})
	fmt.Println("A writes:", err)

	err = locker.Do(ctx, "approval:req:42", func(ctx context.Context, lease *leasehold.Lease) error {
		if err := fence.Write(ctx, reg, lease, "req:42", []byte("denied by B")); err != nil {
			return err
		}
		// The same lease may write again with its fence.
		return fence.Write(ctx, reg, lease, "req:42", []byte("denied by B, with a reason"))
	})
	fmt.Println("B writes twice:", err)

	// A wakes up from a long pause and writes with its old fence.
	err = reg.Write(ctx, "req:42", fenceA, []byte("approved by A, again"))
	fmt.Println("A's late write is stale:", errors.Is(err, fence.ErrStaleFence))

	value, _, _ := reg.Read("req:42")
	fmt.Println("value:", string(value))
	// Output:
	// A writes: <nil>
	// B writes twice: <nil>
	// observed stale_write on memory (locker approval)
	// A's late write is stale: true
	// value: denied by B, with a reason
}
