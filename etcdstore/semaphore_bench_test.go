package etcdstore_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/etcdstore"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
	"github.com/leasehold/leasehold/internal/benchkit"
)

// Permit benchmarks beside the lock in the same run (BENCHMARKS.md
// "Semaphores"):
//
//	go test -run '^$' -bench 'Permit' -benchtime 2000x -count 3 ./etcdstore

// requestCounter sums the requests counted on clients (unary calls and
// stream messages, the store session's keep-alives included).
type requestCounter struct {
	mu    sync.Mutex
	ns    []*calls
	total int64
}

func (r *requestCounter) count() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.ns {
		for _, v := range n.take() {
			r.total += int64(v)
		}
	}
	return r.total
}

// benchStore is a store on its own counting client. Its request timeout is
// 10 s: on the shared 2-core machine an AcquirePermit that retries its
// optimistic transaction under 16 contenders can take over a second.
func benchStore(b *testing.B, c *testetcd.Cluster, rc *requestCounter) *etcdstore.Store {
	cli, n := countingClient(b, c)
	s, err := etcdstore.New(cli, etcdstore.Options{Prefix: benchPrefix, RequestTimeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	rc.ns = append(rc.ns, n)
	return s
}

// BenchmarkPermitVsLease interleaves store lock cycles (Acquire + Release)
// and permit cycles of a semaphore with limit N (AcquirePermit +
// ReleasePermit) on one key each, one client: time per cycle, ratio and
// requests per cycle.
func BenchmarkPermitVsLease(b *testing.B) {
	c := testetcd.Start(b)
	rc := &requestCounter{}
	s := benchStore(b, c, rc)
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
			benchkit.PermitVsLease(b, lease, permit, rc.count)
		})
	}
}

// BenchmarkLockerPermitContended runs 16 Lockers, each on its own store and
// client (as 16 processes), that loop on one key: wait for it (a lease, or a
// permit of a semaphore with limit N), hold it 1 ms, release.
func BenchmarkLockerPermitContended(b *testing.B) {
	c := testetcd.Start(b)
	const replicas = 16
	rc := &requestCounter{}
	lks := make([]*leasehold.Locker, replicas)
	for i := range lks {
		lk, err := leasehold.New(benchStore(b, c, rc), leasehold.Options{
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
		}, rc.count)
	})
	for _, n := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("permit/N=%d", n), func(b *testing.B) {
			sems := benchkit.Semaphores(b, lks, fmt.Sprintf("bench:contended:%d", n), n)
			benchkit.Contended(b, replicas, func(ctx context.Context, i int) (*leasehold.Lease, error) {
				return sems[i].Acquire(ctx)
			}, rc.count)
		})
	}
}
