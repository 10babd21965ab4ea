package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
)

// Two lockers over one in-process store: while one holds a key, the other
// cannot take it. The memory store suits a single process (tests, one
// replica); replicas on several machines need a shared store.
func Example() {
	store := memstore.New()
	a, err := leasehold.New(store, leasehold.Options{Name: "a"})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	b, err := leasehold.New(store, leasehold.Options{Name: "b"})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	ctx := context.Background()
	lease, err := a.TryAcquire(ctx, "report:nightly")
	if err != nil {
		log.Fatal(err)
	}
	_, err = b.TryAcquire(ctx, "report:nightly")
	fmt.Println("b while a holds it:", errors.Is(err, leasehold.ErrNotAcquired))
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// b while a holds it: true
}
