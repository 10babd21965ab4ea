// Package benchkit holds what the stores' benchmarks share: cycles spread
// over goroutines, and the hand-off of one key among waiting Lockers with its
// latency percentiles. It is for benchmarks and tests only.
package benchkit

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
)

// Parallel runs b.N calls of fn spread over g goroutines; goroutine i always
// uses key i (distinct keys: no contention).
func Parallel(b *testing.B, g int, fn func(ctx context.Context, key, token string) error) {
	b.Helper()
	ctx := context.Background()
	var (
		next atomic.Int64
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
			for next.Add(1) <= int64(b.N) {
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

// HandOff passes one key n times among the lockers (at least 2), each
// blocked in Acquire while another holds it. It returns the n hand-off
// latencies, each from just before the holder's Release to the next
// holder's Acquire returning, and the fences of all n+1 acquisitions in
// order. A holder queues again only after its lease was handed off, so
// every sample is a waiter woken by a release, never the holder
// re-acquiring its own key.
func HandOff(parent context.Context, lks []*leasehold.Locker, key string, n int) ([]time.Duration, []uint64, error) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	var (
		mu         sync.Mutex
		cond       = sync.NewCond(&mu)
		gen        int       // acquisitions so far
		releasedAt time.Time // just before the last Release; zero before the first
		samples    = make([]time.Duration, 0, n)
		fences     = make([]uint64, 0, n+1)
		firstErr   error
		wg         sync.WaitGroup
	)
	// Wake the goroutines waiting for their hand-off when the run ends.
	stopWake := context.AfterFunc(ctx, func() { mu.Lock(); cond.Broadcast(); mu.Unlock() })
	defer stopWake()
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel()
	}
	for _, lk := range lks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				l, err := lk.Acquire(ctx, key)
				now := time.Now()
				if err != nil {
					if ctx.Err() == nil {
						fail(err)
					}
					return
				}
				mu.Lock()
				if gen > n { // an Acquire that won the race with the end of the run
					mu.Unlock()
					_ = l.Release(parent)
					return
				}
				if !releasedAt.IsZero() {
					samples = append(samples, now.Sub(releasedAt))
				}
				fences = append(fences, l.Fence())
				gen++
				my, done := gen, gen > n
				cond.Broadcast()
				releasedAt = time.Now()
				mu.Unlock()
				if done {
					cancel() // stop the waiters before the key is free again
				}
				if err := l.Release(parent); err != nil {
					fail(fmt.Errorf("release: %w", err))
					return
				}
				if done {
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
	return samples, fences, firstErr
}

// ReportHandOff runs HandOff with b.N hand-offs among lks on key and reports
// p50-µs, p99-µs and max-µs, with allocations.
func ReportHandOff(b *testing.B, lks []*leasehold.Locker, key string) {
	b.Helper()
	b.ReportAllocs()
	b.ResetTimer()
	samples, _, err := HandOff(context.Background(), lks, key, b.N)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if len(samples) == 0 {
		b.Fatal("no hand-offs measured")
	}
	slices.Sort(samples)
	b.ReportMetric(Quantile(samples, 0.50), "p50-µs")
	b.ReportMetric(Quantile(samples, 0.99), "p99-µs")
	b.ReportMetric(Quantile(samples, 1), "max-µs")
}

// Quantile returns the p-quantile of sorted samples in µs.
func Quantile(sorted []time.Duration, p float64) float64 {
	return float64(sorted[int(p*float64(len(sorted)-1))]) / float64(time.Microsecond)
}
