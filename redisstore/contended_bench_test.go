package redisstore_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// countingStore counts a Store's requests; every other method (the
// optional interfaces) is the embedded Store's.
type countingStore struct {
	*redisstore.Store
	calls *atomic.Int64
}

func (c countingStore) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	c.calls.Add(1)
	return c.Store.Acquire(ctx, req)
}

func (c countingStore) Release(ctx context.Context, key, token string) error {
	c.calls.Add(1)
	return c.Store.Release(ctx, key, token)
}

func (c countingStore) Renew(ctx context.Context, key, token string, ttl time.Duration) error {
	c.calls.Add(1)
	return c.Store.Renew(ctx, key, token, ttl)
}

// BenchmarkContended: 8 replicas (each its own Store and Locker, as 8
// processes) take turns on one key with a 1 ms hold. Metrics: store
// requests per acquisition (acquire, release and renew; subscriptions are
// not counted, a lingering channel makes most of them free), wait p99,
// min/max acquisitions per replica.
func BenchmarkContended(b *testing.B) {
	const replicas = 8
	srv := testredis.Start(b)
	c := srv.Client(b)
	var requests atomic.Int64
	lockers := make([]*leasehold.Locker, replicas)
	for i := range lockers {
		s, err := redisstore.New(c, redisstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close() })
		lk, err := leasehold.New(countingStore{s, &requests}, leasehold.Options{Name: "bench", TTL: 10 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = lk.Close() })
		lockers[i] = lk
	}
	var (
		total  atomic.Int64
		mu     sync.Mutex
		waits  []time.Duration
		perRep = make([]int, replicas)
		wg     sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b.ResetTimer()
	for i := range replicas {
		wg.Go(func() {
			for total.Load() < int64(b.N) {
				start := time.Now()
				l, err := lockers[i].Acquire(ctx, "bench:contended")
				if err != nil {
					b.Error(err)
					return
				}
				total.Add(1)
				mu.Lock()
				waits = append(waits, time.Since(start))
				perRep[i]++
				mu.Unlock()
				time.Sleep(time.Millisecond)
				_ = l.Release(context.Background())
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	slices.Sort(waits)
	n := len(waits)
	if n == 0 {
		b.Fatal("no acquisitions")
	}
	b.ReportMetric(float64(requests.Load())/float64(n), "req/acq")
	b.ReportMetric(float64(waits[int(0.99*float64(n-1))])/float64(time.Millisecond), "wait-p99-ms")
	b.ReportMetric(float64(slices.Min(perRep))/float64(slices.Max(perRep)), "min/max")
}
