package leasehold_test

import (
	"context"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/memstore"
)

// BenchmarkCycle measures the Locker's own cost per TryAcquire + Release on
// the embedded store (no network): compare with BenchmarkStoreCycle.
func BenchmarkCycle(b *testing.B) {
	store := memstore.New()
	l, err := leasehold.New(store, leasehold.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	var n atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		key := "bench:" + strconv.FormatInt(n.Add(1), 10)
		for pb.Next() {
			ls, err := l.TryAcquire(ctx, key)
			if err != nil {
				b.Fatal(err)
			}
			if err := ls.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkStoreCycle is the floor for BenchmarkCycle: Acquire + Release
// straight on the store.
func BenchmarkStoreCycle(b *testing.B) {
	store := memstore.New()
	ctx := context.Background()
	var n atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		key := "bench:" + strconv.FormatInt(n.Add(1), 10)
		token := leasehold.NewToken()
		for pb.Next() {
			if _, err := store.Acquire(ctx, driver.AcquireRequest{Key: key, Token: token, TTL: leasehold.DefaultTTL}); err != nil {
				b.Fatal(err)
			}
			if err := store.Release(ctx, key, token); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCycleInterleaved alternates blocks of 64 store cycles and 64
// Locker cycles (TryAcquire + Release) on the embedded store, one goroutine,
// and reports the median block time of each per cycle and their ratio: the
// Locker's own cost, compared under the same machine load.
func BenchmarkCycleInterleaved(b *testing.B) {
	store := memstore.New()
	l, err := leasehold.New(store, leasehold.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	token := leasehold.NewToken()
	const block = 64
	storeBlock := func() time.Duration {
		t0 := time.Now()
		for range block {
			if _, err := store.Acquire(ctx, driver.AcquireRequest{Key: "bench:store", Token: token, TTL: leasehold.DefaultTTL}); err != nil {
				b.Fatal(err)
			}
			if err := store.Release(ctx, "bench:store", token); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(t0)
	}
	lockerBlock := func() time.Duration {
		t0 := time.Now()
		for range block {
			ls, err := l.TryAcquire(ctx, "bench:locker")
			if err != nil {
				b.Fatal(err)
			}
			if err := ls.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(t0)
	}
	var st, lk []time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += block {
		st = append(st, storeBlock())
		lk = append(lk, lockerBlock())
	}
	b.StopTimer()
	slices.Sort(st)
	slices.Sort(lk)
	s50, l50 := float64(st[len(st)/2])/block, float64(lk[len(lk)/2])/block
	b.ReportMetric(s50, "store-ns/cycle-p50")
	b.ReportMetric(l50, "locker-ns/cycle-p50")
	b.ReportMetric(l50/s50, "locker/store-p50")
}
