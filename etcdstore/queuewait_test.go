package etcdstore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
	"google.golang.org/grpc"
)

// An acquire of a short TTL that waits in the store's queue longer than its
// lease lives (two slow requests ahead of it) still takes its free key, and
// a release batched with it still releases.
func TestAcquireQueuedPastItsLease(t *testing.T) {
	c := testetcd.Start(t)
	ctx := ctxFor(t, 20*time.Second)
	var slow atomic.Int32
	s := interceptedStore(t, c, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == "/etcdserverpb.KV/Txn" && slow.Add(-1) >= 0 {
			time.Sleep(3 * time.Second)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	key := uniqueKey(t, "")
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key + "held", Token: "h", TTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	slow.Store(2)
	var wg sync.WaitGroup
	for _, k := range []string{"a", "b"} { // the two requests in flight, slow
		wg.Go(func() {
			if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key + k, Token: "t", TTL: 10 * time.Second}); err != nil {
				t.Error(err)
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	wg.Go(func() {
		if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key + "short", Token: "t", TTL: time.Second}); err != nil {
			t.Errorf("the queued acquire: %v", err)
		}
	})
	time.Sleep(100 * time.Millisecond)
	wg.Go(func() {
		if err := s.Release(ctx, key+"held", "h"); err != nil {
			t.Errorf("the queued release: %v", err)
		}
	})
	wg.Wait()
}
