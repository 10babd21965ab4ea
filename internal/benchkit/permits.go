package benchkit

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
)

// Cycle is one acquire + release cycle with token.
type Cycle func(ctx context.Context, token string) error

// PermitVsLease interleaves, in chunks of 200, lease cycles and permit
// cycles so that both see the same machine load, and reports each one's time
// per cycle, their ratio and the requests each cycle sent (requests counts
// every request the store has sent so far). One b.N is one lease cycle plus
// one permit cycle.
func PermitVsLease(b *testing.B, lease, permit Cycle, requests func() int64) {
	ctx := context.Background()
	var t [2]time.Duration
	var sent [2]int64
	b.ResetTimer()
	for done := 0; done < b.N; {
		k := min(200, b.N-done)
		for j, cycle := range []Cycle{lease, permit} {
			n0, t0 := requests(), time.Now()
			for range k {
				if err := cycle(ctx, leasehold.NewToken()); err != nil {
					b.Fatal(err)
				}
			}
			t[j] += time.Since(t0)
			sent[j] += requests() - n0
		}
		done += k
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(t[0].Nanoseconds())/n, "lease-ns/cycle")
	b.ReportMetric(float64(t[1].Nanoseconds())/n, "permit-ns/cycle")
	b.ReportMetric(float64(t[1])/float64(t[0]), "permit/lease-time")
	b.ReportMetric(float64(sent[0])/n, "lease-reqs/cycle")
	b.ReportMetric(float64(sent[1])/n, "permit-reqs/cycle")
}

// Contended runs one loop per replica: wait for the key with acquire(i),
// hold it 1 ms, release; one b.N is one acquisition. It reports the wait
// p50 and p99, acquisitions per second and, with requests, the requests
// every replica sent per acquisition (waits, wake-ups and releases
// included).
func Contended(b *testing.B, replicas int, acquire func(ctx context.Context, i int) (*leasehold.Lease, error), requests func() int64) {
	var (
		next  atomic.Int64
		mu    sync.Mutex
		waits []time.Duration
		wg    sync.WaitGroup
	)
	ctx := context.Background()
	b.ResetTimer()
	n0, start := requests(), time.Now()
	for i := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				ls, err := acquire(ctx, i)
				if err != nil {
					b.Error(err)
					return
				}
				w := time.Since(t0)
				time.Sleep(time.Millisecond)
				if err := ls.Release(ctx); err != nil {
					b.Error(err)
				}
				mu.Lock()
				waits = append(waits, w)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	el, sent := time.Since(start), requests()-n0
	b.StopTimer()
	slices.Sort(waits)
	if len(waits) == 0 {
		return
	}
	b.ReportMetric(Quantile(waits, 0.5), "wait-p50-µs")
	b.ReportMetric(Quantile(waits, 0.99), "wait-p99-µs")
	b.ReportMetric(float64(len(waits))/el.Seconds(), "acq/s")
	b.ReportMetric(float64(sent)/float64(len(waits)), "reqs/acq")
}

// Semaphores returns one Semaphore of key with limit n per Locker.
func Semaphores(b *testing.B, lks []*leasehold.Locker, key string, n int) []*leasehold.Semaphore {
	sems := make([]*leasehold.Semaphore, len(lks))
	for i, lk := range lks {
		sem, err := lk.Semaphore(key, n)
		if err != nil {
			b.Fatalf("Locker.Semaphore: %v", err)
		}
		sems[i] = sem
	}
	return sems
}
