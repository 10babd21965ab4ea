package pgstore_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/benchkit"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

// Permit benchmarks beside the lock in the same run (BENCHMARKS.md
// "Semaphores"):
//
//	go test -run '^$' -bench 'Permit' -benchtime 2000x -count 3 ./pgstore

// queryCounter is a pgx tracer that counts the statements sent (a
// statement is one round trip here: the store sends no batches).
type queryCounter struct{ n atomic.Int64 }

func (q *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	q.n.Add(1)
	return ctx
}

func (q *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (q *queryCounter) count() int64 { return q.n.Load() }

// tracedStore is a store on its own pool whose statements q counts.
func tracedStore(b *testing.B, dsn string, q *queryCounter) *pgstore.Store {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.Tracer = q
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read committed"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	s, err := pgstore.New(ctx, pool, pgstore.Options{Migrate: pgstore.MigrateCreate})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// BenchmarkPermitVsLease interleaves store lock cycles (Acquire + Release)
// and permit cycles of a semaphore with limit N (AcquirePermit +
// ReleasePermit) on one key each: time per cycle, ratio and statements per
// cycle.
func BenchmarkPermitVsLease(b *testing.B) {
	srv := testpg.Start(b)
	q := &queryCounter{}
	s := tracedStore(b, srv.CreateDatabase(b), q)
	const ttl = 30 * time.Second
	for _, n := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			lockKey, semKey := fmt.Sprintf("bench:lock:%d", n), fmt.Sprintf("bench:sem:%d", n)
			lease := func(ctx context.Context, tok string) error {
				if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: lockKey, Token: tok, TTL: ttl, Holder: "bench"}); err != nil {
					return err
				}
				return s.Release(ctx, lockKey, tok)
			}
			permit := func(ctx context.Context, tok string) error {
				if _, err := s.AcquirePermit(ctx, driver.PermitRequest{Key: semKey, Token: tok, TTL: ttl, Limit: n, Holder: "bench"}); err != nil {
					return err
				}
				return s.ReleasePermit(ctx, semKey, tok)
			}
			benchkit.PermitVsLease(b, lease, permit, q.count)
		})
	}
}

// BenchmarkLockerPermitContended runs 16 Lockers, each on its own store and
// pool (its own LISTEN connection, as 16 processes), that loop on one key:
// wait for it (a lease, or a permit of a semaphore with limit N), hold it
// 1 ms, release.
func BenchmarkLockerPermitContended(b *testing.B) {
	srv := testpg.Start(b)
	dsn := srv.CreateDatabase(b)
	const replicas = 16
	q := &queryCounter{}
	lks := make([]*leasehold.Locker, replicas)
	for i := range lks {
		lk, err := leasehold.New(tracedStore(b, dsn, q), leasehold.Options{
			Name: "bench", TTL: 10 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = lk.Close() })
		lks[i] = lk
	}
	b.Run("lease", func(b *testing.B) {
		benchkit.Contended(b, replicas, func(ctx context.Context, i int) (*leasehold.Lease, error) {
			return lks[i].Acquire(ctx, "bench:contended:lease")
		}, q.count)
	})
	for _, n := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("permit/N=%d", n), func(b *testing.B) {
			sems := benchkit.Semaphores(b, lks, fmt.Sprintf("bench:contended:%d", n), n)
			benchkit.Contended(b, replicas, func(ctx context.Context, i int) (*leasehold.Lease, error) {
				return sems[i].Acquire(ctx)
			}, q.count)
		})
	}
}
