package leasehold_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/leasehold/leasehold"
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
			if _, err := store.Acquire(ctx, leasehold.AcquireRequest{Key: key, Token: token, TTL: leasehold.DefaultTTL}); err != nil {
				b.Fatal(err)
			}
			if err := store.Release(ctx, key, token); err != nil {
				b.Fatal(err)
			}
		}
	})
}
