package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/benchkit"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// floorRelease is the raw floor's compare-and-delete.
var floorRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// BenchmarkCycle measures acquire+release cycles on distinct keys, side by
// side: the raw two-command floor (SET NX PX + compare-and-delete EVALSHA),
// the Store (acquire script with fence + release script with PUBLISH), and
// the Locker (TryAcquire + Release, including its renewal goroutine).
func BenchmarkCycle(b *testing.B) {
	srv := testredis.Start(b)
	c := srv.Client(b)
	s, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	lk, err := leasehold.New(s, leasehold.Options{Name: "bench", TTL: 30 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = lk.Close() })
	if err := floorRelease.Load(context.Background(), c).Err(); err != nil {
		b.Fatal(err)
	}
	const ttl = 30 * time.Second

	for _, g := range []int{1, 16} {
		b.Run(fmt.Sprintf("floor/g=%d", g), func(b *testing.B) {
			benchkit.Parallel(b, g, func(ctx context.Context, key, token string) error {
				ok, err := c.SetNX(ctx, key, token, ttl).Result()
				if err != nil || !ok {
					return fmt.Errorf("SET NX: %v %v", ok, err)
				}
				if n, err := floorRelease.Run(ctx, c, []string{key}, token).Int(); err != nil || n != 1 {
					return fmt.Errorf("release: %v %v", n, err)
				}
				return nil
			})
		})
		b.Run(fmt.Sprintf("store/g=%d", g), func(b *testing.B) {
			benchkit.Parallel(b, g, func(ctx context.Context, key, token string) error {
				if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: token, TTL: ttl}); err != nil {
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
// goroutines, each with its own Locker and Store (as 8 processes would): the
// time from just before the holder calls Release until the next waiter's
// Acquire returns. The holder waits for the hand-off before it queues again,
// so every sample is a real hand-off to a waiter woken by the release
// notification.
func BenchmarkHandOff(b *testing.B) {
	srv := testredis.Start(b)
	c := srv.Client(b)
	const waiters = 8
	key := "bench:handoff"
	lockers := make([]*leasehold.Locker, waiters)
	for i := range lockers {
		s, err := redisstore.New(c, redisstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close() })
		// WaitCap 10s: a waiter that missed the notification shows up in p99.
		lk, err := leasehold.New(s, leasehold.Options{Name: "bench", TTL: 30 * time.Second, WaitCap: 10 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = lk.Close() })
		lockers[i] = lk
	}

	benchkit.ReportHandOff(b, lockers, key)
}

// BenchmarkHandOffLocal is BenchmarkHandOff inside one process: the 8
// goroutines share one Locker, so they queue on its local gate (FIFO) and the
// hand-off is the Locker's own: from just before Release until the next
// goroutine's Acquire returns.
func BenchmarkHandOffLocal(b *testing.B) {
	srv := testredis.Start(b)
	s, err := redisstore.New(srv.Client(b), redisstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	lk, err := leasehold.New(s, leasehold.Options{Name: "bench", TTL: 30 * time.Second, WaitCap: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = lk.Close() })
	lockers := make([]*leasehold.Locker, 8)
	for i := range lockers {
		lockers[i] = lk
	}
	benchkit.ReportHandOff(b, lockers, "bench:handoff-local")
}

// BenchmarkCycleInterleaved runs one floor, one Store and one Locker cycle
// in turn on every iteration, each iteration starting with the next one of
// the three (a fixed order put the Locker 5-10 % behind the Store by
// position alone), and reports each one's mean time and its ratio to the
// floor: on a shared machine whose load changes from second to second,
// interleaving compares the three under the same load, which separate
// sub-benchmarks do not. The p50 metrics are the medians of the
// per-iteration times, which a few iterations stalled by other processes on
// a shared machine move far less than the means.
func BenchmarkCycleInterleaved(b *testing.B) {
	srv := testredis.Start(b)
	c := srv.Client(b)
	s, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	lk, err := leasehold.New(s, leasehold.Options{Name: "bench", TTL: 30 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = lk.Close() })
	if err := floorRelease.Load(context.Background(), c).Err(); err != nil {
		b.Fatal(err)
	}
	const ttl = 30 * time.Second
	for _, g := range []int{1, 16} {
		b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) {
			var floorNs, storeNs, lockerNs atomic.Int64
			var next atomic.Int64
			samples := [3][]time.Duration{make([]time.Duration, b.N), make([]time.Duration, b.N), make([]time.Duration, b.N)}
			benchkit.Parallel(b, g, func(ctx context.Context, key, token string) error {
				cycles := [3]func() error{
					func() error {
						if ok, err := c.SetNX(ctx, key+":floor", token, ttl).Result(); err != nil || !ok {
							return fmt.Errorf("SET NX: %v %v", ok, err)
						}
						if n, err := floorRelease.Run(ctx, c, []string{key + ":floor"}, token).Int(); err != nil || n != 1 {
							return fmt.Errorf("release: %v %v", n, err)
						}
						return nil
					},
					func() error {
						if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key + ":store", Token: token, TTL: ttl}); err != nil {
							return err
						}
						return s.Release(ctx, key+":store", token)
					},
					func() error {
						l, err := lk.TryAcquire(ctx, key+":locker")
						if err != nil {
							return err
						}
						return l.Release(ctx)
					},
				}
				i := next.Add(1) - 1
				var took [3]time.Duration
				for j := range cycles {
					k := (int(i) + j) % len(cycles) // each cycle in each position in turn
					t0 := time.Now()
					if err := cycles[k](); err != nil {
						return err
					}
					took[k] = time.Since(t0)
				}
				floorNs.Add(int64(took[0]))
				storeNs.Add(int64(took[1]))
				lockerNs.Add(int64(took[2]))
				if i < int64(b.N) {
					samples[0][i], samples[1][i], samples[2][i] = took[0], took[1], took[2]
				}
				return nil
			})
			var p50 [3]float64
			for i, d := range samples {
				slices.Sort(d)
				p50[i] = benchkit.Quantile(d, 0.5)
			}
			b.ReportMetric(p50[1]/p50[0], "store/floor-p50")
			b.ReportMetric(p50[2]/p50[0], "locker/floor-p50")
			b.ReportMetric(p50[2]/p50[1], "locker/store-p50")
			n := float64(b.N)
			f, st, l := float64(floorNs.Load())/n, float64(storeNs.Load())/n, float64(lockerNs.Load())/n
			b.ReportMetric(f, "floor-ns/cycle")
			b.ReportMetric(st, "store-ns/cycle")
			b.ReportMetric(l, "locker-ns/cycle")
			b.ReportMetric(st/f, "store/floor")
			b.ReportMetric(l/f, "locker/floor")
		})
	}
}
