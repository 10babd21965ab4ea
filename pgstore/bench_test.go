package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/benchkit"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

// BenchmarkCycle measures acquire+release cycles on distinct keys: the raw
// floor (INSERT ... ON CONFLICT DO NOTHING + token-checked DELETE, no fence,
// no expiry, no notification), the Store, and the Locker.
func BenchmarkCycle(b *testing.B) {
	srv := testpg.Start(b)
	dsn := srv.CreateDatabase(b)
	s := open(b, dsn, pgstore.Options{})
	pool := testpg.Connect(b, dsn, pgxpool.New)
	if _, err := pool.Exec(context.Background(), "CREATE TABLE floor (key text PRIMARY KEY, token text NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	lk, err := leasehold.New(s, leasehold.Options{Name: "bench", TTL: 30 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = lk.Close() })
	for _, g := range []int{1, 16} {
		b.Run(fmt.Sprintf("floor/g=%d", g), func(b *testing.B) {
			benchkit.Parallel(b, g, func(ctx context.Context, key, token string) error {
				tag, err := pool.Exec(ctx, "INSERT INTO floor VALUES ($1, $2) ON CONFLICT DO NOTHING", key, token)
				if err != nil || tag.RowsAffected() != 1 {
					return fmt.Errorf("insert: %v %v", tag, err)
				}
				tag, err = pool.Exec(ctx, "DELETE FROM floor WHERE key = $1 AND token = $2", key, token)
				if err != nil || tag.RowsAffected() != 1 {
					return fmt.Errorf("delete: %v %v", tag, err)
				}
				return nil
			})
		})
		b.Run(fmt.Sprintf("store/g=%d", g), func(b *testing.B) {
			benchkit.Parallel(b, g, func(ctx context.Context, key, token string) error {
				if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: token, TTL: 30 * time.Second}); err != nil {
					return err
				}
				return s.Release(ctx, key, token)
			})
		})
		b.Run(fmt.Sprintf("locker/g=%d", g), func(b *testing.B) {
			benchkit.Parallel(b, g, func(ctx context.Context, key, _ string) error {
				l, err := lk.TryAcquire(ctx, key)
				if err != nil {
					return err
				}
				return l.Release(ctx)
			})
		})
	}
}

// BenchmarkHandOff measures the hand-off latency of one key among 8
// goroutines, each with its own Locker and Store (its own LISTEN
// connection, as 8 processes would have): from just before the holder calls
// Release until the next waiter's Acquire returns. WaitCap is 10 s, so a
// waiter that missed the notification shows in p99.
func BenchmarkHandOff(b *testing.B) {
	srv := testpg.Start(b)
	dsn := srv.CreateDatabase(b)
	const waiters = 8
	key := "bench:handoff"
	lockers := make([]*leasehold.Locker, waiters)
	for i := range lockers {
		s := open(b, dsn, pgstore.Options{})
		lk, err := leasehold.New(s, leasehold.Options{Name: "bench", TTL: 30 * time.Second, WaitCap: 10 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = lk.Close() })
		lockers[i] = lk
	}
	benchkit.ReportHandOff(b, lockers, key)
}
