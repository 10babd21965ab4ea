package prommetrics_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/memstore"
	"github.com/leasehold/leasehold/prommetrics"
)

func Example() {
	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer
	obs, err := prommetrics.New(reg, prommetrics.Options{})
	if err != nil {
		panic(err)
	}
	// One Observer for every locker of the process; the Name is the label.
	locker, err := leasehold.New(memstore.New(), leasehold.Options{
		Name: "approval", Observer: obs, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	ctx := context.Background()
	for _, key := range []string{"invoice/1", "invoice/2", "invoice/3"} {
		lease, err := locker.TryAcquire(ctx, key)
		if err != nil {
			panic(err)
		}
		_ = lease.Release(ctx)
	}
	n, _ := testutil.GatherAndCount(reg, "leasehold_acquire_wait_seconds")
	fmt.Println("acquire wait series:", n) // one per result, whatever the keys
	// Output:
	// acquire wait series: 3
}
