package pgstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

// parallel runs b.N calls of fn spread over g goroutines; goroutine i always
// uses key i.
func parallel(b *testing.B, g int, fn func(ctx context.Context, key, token string) error) {
	b.Helper()
	ctx := context.Background()
	var (
		next int64
		wg   sync.WaitGroup
		errc = make(chan error, g)
	)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key, token := fmt.Sprintf("bench:%s:%d", b.Name(), i), leasehold.NewToken()
			for atomic.AddInt64(&next, 1) <= int64(b.N) {
				if err := fn(ctx, key, token); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errc)
	for err := range errc {
		b.Fatal(err)
	}
}

// BenchmarkCycle measures acquire+release cycles on distinct keys: the raw
// floor (INSERT ... ON CONFLICT DO NOTHING + token-checked DELETE, no fence,
// no expiry, no notification), the Store, and the Locker.
func BenchmarkCycle(b *testing.B) {
	srv := testpg.Start(b)
	dsn := srv.CreateDatabase(b)
	s := open(b, dsn, pgstore.Options{})
	pool := testpg.Connect(b, dsn)
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
			parallel(b, g, func(ctx context.Context, key, token string) error {
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
			parallel(b, g, func(ctx context.Context, key, token string) error {
				if _, err := s.Acquire(ctx, key, token, 30*time.Second); err != nil {
					return err
				}
				return s.Release(ctx, key, token)
			})
		})
		b.Run(fmt.Sprintf("locker/g=%d", g), func(b *testing.B) {
			parallel(b, g, func(ctx context.Context, key, _ string) error {
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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu         sync.Mutex
		cond       = sync.NewCond(&mu)
		gen        int
		releasedAt time.Time
		samples    = make([]time.Duration, 0, b.N)
		wg         sync.WaitGroup
		errc       = make(chan error, waiters)
	)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				l, err := lockers[i].Acquire(ctx, key)
				now := time.Now()
				if err != nil {
					if ctx.Err() == nil {
						errc <- err
						cancel()
					}
					return
				}
				mu.Lock()
				if !releasedAt.IsZero() {
					samples = append(samples, now.Sub(releasedAt))
				}
				gen++
				my, done := gen, gen > b.N
				cond.Broadcast()
				releasedAt = time.Now()
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					errc <- err
					cancel()
					return
				}
				if done {
					cancel()
					mu.Lock()
					cond.Broadcast()
					mu.Unlock()
					return
				}
				mu.Lock()
				for gen == my && ctx.Err() == nil {
					cond.Wait()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errc)
	for err := range errc {
		b.Fatal(err)
	}
	if len(samples) == 0 {
		b.Fatal("no hand-offs measured")
	}
	slices.Sort(samples)
	q := func(p float64) float64 { return float64(samples[int(p*float64(len(samples)-1))].Microseconds()) }
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
	b.ReportMetric(float64(samples[len(samples)-1].Microseconds()), "max-µs")
}
