package etcdstore_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
)

// BenchmarkStoreAcquireRelease is the raw store cycle on one embedded member
// over loopback: LeaseGrant + Txn, then the Release Txn (the lease revoke runs
// in the background).
func BenchmarkStoreAcquireRelease(b *testing.B) {
	c := testetcd.Start(b)
	s := benchStore(b, c)
	ctx := b.Context()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		key := fmt.Sprintf("bench:%d", i%64)
		tok := leasehold.NewToken()
		if _, err := s.Acquire(ctx, leasehold.AcquireRequest{Key: key, Token: tok, TTL: 10 * time.Second}); err != nil {
			b.Fatal(err)
		}
		if err := s.Release(ctx, key, tok); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkLockerTryAcquireRelease is the same cycle through a Locker
// (local gate, lease keeper goroutine, observer events).
func BenchmarkLockerTryAcquireRelease(b *testing.B) {
	c := testetcd.Start(b)
	lk := benchLocker(b, c)
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		l, err := lk.TryAcquire(ctx, "bench:locker")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHandOff measures how long a waiter blocked in Acquire (another
// Locker, another client: another replica) takes to get the key after the
// holder's Release starts. The waiter wakes on the watch's delete event.
// Reports p50 and p99 in microseconds.
func BenchmarkHandOff(b *testing.B) {
	c := testetcd.Start(b)
	holder, waiter := benchLocker(b, c), benchLocker(b, c)
	ctx := b.Context()
	key := "bench:handoff"
	var lat []time.Duration
	for b.Loop() {
		l, err := holder.TryAcquire(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan time.Time, 1)
		errc := make(chan error, 1)
		go func() {
			wl, err := waiter.Acquire(ctx, key)
			if err != nil {
				errc <- err
				return
			}
			got <- time.Now()
			_ = wl.Release(context.WithoutCancel(ctx))
		}()
		b.StopTimer()
		time.Sleep(30 * time.Millisecond) // let the waiter try, subscribe and block
		b.StartTimer()
		start := time.Now()
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		select {
		case at := <-got:
			lat = append(lat, at.Sub(start))
		case err := <-errc:
			b.Fatal(err)
		}
		// Wait for the waiter's release before the next round.
		b.StopTimer()
		for {
			if _, err := holder.Store().(leasehold.Inspector).Inspect(ctx, key); err != nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		b.StartTimer()
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds()), "p99-µs")
}

func benchStore(b *testing.B, c *testetcd.Cluster) leasehold.Store {
	b.Helper()
	s, err := newStoreTB(b, c)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func benchLocker(b *testing.B, c *testetcd.Cluster) *leasehold.Locker {
	b.Helper()
	lk, err := leasehold.New(benchStore(b, c), leasehold.Options{
		Name: "bench", TTL: 10 * time.Second, WaitCap: time.Minute,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = lk.Close() })
	return lk
}
