package pgfence_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/pgfence"
	"github.com/leasehold/leasehold/memstore"
)

// Fenced writes to PostgreSQL can join the caller's transaction.
func ExampleTable_WithDB() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal/app")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	jobs, err := pgfence.NewTable(pool, pgfence.TableOptions{Table: "jobs", DataColumn: "state", Name: "scheduler"})
	if err != nil {
		panic(err)
	}
	locker, err := leasehold.New(memstore.New(), leasehold.Options{Name: "scheduler"})
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	err = locker.Do(ctx, "scheduler:job:42", func(ctx context.Context, lease *leasehold.Lease) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if err := fence.Write(ctx, jobs.WithDB(tx), lease, "42", []byte(`{"state":"done"}`)); err != nil {
			return err // errors.Is(err, fence.ErrStaleFence): another holder took over
		}
		// ... other writes in the same transaction ...
		return tx.Commit(ctx)
	})
	if errors.Is(err, fence.ErrStaleFence) {
		fmt.Println("a newer holder owns job 42; dropping this result")
	}
}
