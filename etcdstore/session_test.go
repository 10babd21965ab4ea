package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/etcdstore"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// calls counts the gRPC requests of one client by method: unary calls and
// messages sent on streams (watch creates and cancels, keep-alives).
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) add(method string) {
	c.mu.Lock()
	c.n[method]++
	c.mu.Unlock()
}

func (c *calls) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

// countingStream counts the messages sent on a stream.
type countingStream struct {
	grpc.ClientStream
	n      *calls
	method string
}

func (s countingStream) SendMsg(m any) error {
	s.n.add(s.method)
	return s.ClientStream.SendMsg(m)
}

// total returns the number of requests in n.
func total(n map[string]int) int {
	t := 0
	for _, v := range n {
		t += v
	}
	return t
}

// countingClient returns a client of c whose requests are counted.
func countingClient(tb testing.TB, c *testetcd.Cluster) (*clientv3.Client, *calls) {
	tb.Helper()
	n := &calls{n: map[string]int{}}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				n.add(method)
				return invoker(ctx, method, req, reply, cc, opts...)
			}),
			grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				cs, err := streamer(ctx, desc, cc, method, opts...)
				if err != nil {
					return nil, err
				}
				return countingStream{cs, n, method}, nil
			}),
		},
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli, n
}

// countingStore returns a store (testOptions) on a client of c whose
// requests are counted; it closes with the test.
func countingStore(t *testing.T, c *testetcd.Cluster) (*etcdstore.Store, *calls) {
	t.Helper()
	cli, n := countingClient(t, c)
	s, err := etcdstore.New(cli, testOptions)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, n
}

// An uncontended acquire and release cost two requests (two transactions):
// no LeaseGrant, no LeaseRevoke per lock, only a LeaseGrant per TTL class
// about every second.
func TestTwoRequestsPerCycle(t *testing.T) {
	c := testetcd.Start(t)
	cli, n := countingClient(t, c)
	s, err := etcdstore.New(cli, etcdstore.Options{Prefix: "lh-test/"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := ctxFor(t, 20*time.Second)
	cycle := func(i int) {
		key, tok := fmt.Sprintf("k%d", i%4), leasehold.NewToken()
		if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: tok, TTL: 10 * time.Second}); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, key, tok); err != nil {
			t.Fatal(err)
		}
	}
	cycle(0) // grants the lease
	n.take()
	start := time.Now()
	const cycles = 50
	for i := range cycles {
		cycle(i)
	}
	got := n.take()
	txns := got["/etcdserverpb.KV/Txn"]
	delete(got, "/etcdserverpb.KV/Txn")
	grants := got["/etcdserverpb.Lease/LeaseGrant"]
	delete(got, "/etcdserverpb.Lease/LeaseGrant")
	if txns != 2*cycles || len(got) != 0 || grants > int(time.Since(start)/time.Second)+1 {
		t.Fatalf("%d cycles in %v: expected %d transactions and a lease grant a second at most, got %d, %d grants and %v",
			cycles, time.Since(start), 2*cycles, txns, grants, got)
	}
}

// A waiter granted the key by a release (capped at its queue TTL) takes it
// with one transaction, which restores its full TTL, and releases it with one
// more, granting it to the next waiter: the grant told it the queue's head.
func TestGrantedWaiterOneRequestEach(t *testing.T) {
	c := testetcd.Start(t)
	ctx := ctxFor(t, 20*time.Second)
	holder, next := newStore(t, c), newStore(t, c)
	s, n := countingStore(t, c)
	key := uniqueKey(t, "granted")
	req := func(tok string) driver.AcquireRequest {
		return driver.AcquireRequest{Key: key, Token: tok, TTL: 10 * time.Second, QueueTTL: 3 * time.Second}
	}
	if _, err := holder.Acquire(ctx, req("h")); err != nil {
		t.Fatal(err)
	}
	wait := func(s *etcdstore.Store, tok string) <-chan driver.Wake {
		if _, err := s.Acquire(ctx, req(tok)); !errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("%s: expected ErrNotAcquired, got %v", tok, err)
		}
		wake, stop, err := s.WaitRelease(ctx, key, tok)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		return wake
	}
	granted := func(wake <-chan driver.Wake) driver.Wake { return grantOn(t, ctx, wake) }
	wake, nextWake := wait(s, "w"), wait(next, "x")
	if err := holder.Release(ctx, key, "h"); err != nil {
		t.Fatal(err)
	}
	w := granted(wake)
	n.take()
	g, err := s.Acquire(ctx, req("w"))
	if err != nil || g.Fence != w.Fence {
		t.Fatalf("the granted waiter's Acquire: expected fence %d, got %v, %v", w.Fence, g, err)
	}
	if got := n.take(); total(got) != 1 {
		t.Fatalf("the granted waiter's Acquire: expected one transaction, got %v", got)
	}
	if info, err := holder.Inspect(ctx, key); err != nil || info.Remaining <= 3*time.Second {
		t.Fatalf("expected the lock's lease past the queue TTL after the Acquire, got %v, %v", info, err)
	}
	if err := s.Release(ctx, key, "w"); err != nil {
		t.Fatal(err)
	}
	if got := n.take(); total(got) != 1 {
		t.Fatalf("the granted waiter's Release: expected one transaction, got %v", got)
	}
	if x := granted(nextWake); x.Fence <= w.Fence {
		t.Fatalf("the next waiter's fence %d is not above %d", x.Fence, w.Fence)
	}
}

// A lock whose holder stops renewing it is deleted by etcd soon after its
// TTL, although the store's other lock of the same TTL is renewed.
func TestAbandonedLockEndsAtItsTTL(t *testing.T) {
	c := testetcd.Start(t)
	s := newStore(t, c)
	ctx := ctxFor(t, 20*time.Second)
	abandoned, kept := uniqueKey(t, "abandoned"), uniqueKey(t, "kept")
	const ttl = time.Second
	start := time.Now()
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: abandoned, Token: "a", TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: kept, Token: "k", TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	var gone time.Duration
	for time.Since(start) < 5*time.Second {
		if err := s.Renew(ctx, kept, "k", ttl); err != nil {
			t.Fatalf("renewing the kept lock: %v", err)
		}
		if _, err := s.Inspect(ctx, abandoned); errors.Is(err, leasehold.ErrNotHeld) {
			gone = time.Since(start)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if gone == 0 {
		t.Fatalf("a %v lock nobody renews still held after 5s (the shared lease kept it alive)", ttl)
	}
	if gone < ttl {
		t.Fatalf("the abandoned lock ended after %v, before its TTL %v", gone, ttl)
	}
	if err := s.Renew(ctx, abandoned, "a", ttl); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("Renew of the abandoned lock: expected ErrNotOwned, got %v", err)
	}
	if _, err := s.Inspect(ctx, kept); err != nil {
		t.Fatalf("the renewed lock: expected it held, got %v", err)
	}
}

// After Close nothing is left on the server: no lock, no queue entry, no
// lease, also after 16 goroutines cycling and locks still held at Close.
func TestNothingLeftAfterClose(t *testing.T) {
	_, cli, s, ctx := startStore(t, 30*time.Second)
	var wg sync.WaitGroup
	var cycles atomic.Int64
	for g := range 16 {
		wg.Go(func() {
			for i := range 30 {
				key, tok := fmt.Sprintf("g%d-%d", g, i%3), leasehold.NewToken()
				if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: tok, TTL: time.Duration(1+i%3) * time.Second}); err != nil {
					t.Error(err)
					return
				}
				if err := s.Release(ctx, key, tok); err != nil {
					t.Error(err)
					return
				}
				cycles.Add(1)
			}
		})
	}
	wg.Wait()
	// Held at Close: a lock and a waiter behind it.
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "held", Token: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "held", Token: "w", TTL: time.Minute, QueueTTL: time.Minute}); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("waiter: expected ErrNotAcquired, got %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	keys, err := cli.Get(ctx, "lh-test/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	ls, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys.Kvs) != 0 || len(ls.Leases) != 0 {
		t.Fatalf("after %d cycles and Close: expected no key and no lease, got %d keys and %d leases", cycles.Load(), len(keys.Kvs), len(ls.Leases))
	}
}

// A lock nobody renews is deleted by etcd although the store's connection
// was cut around its TTL and came back: nothing the store does or fails to
// do keeps it.
func TestAbandonedLockEndsAfterAnOutage(t *testing.T) {
	c := testetcd.Start(t)
	proxy := startFreezer(t, c.Endpoints()[0])
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{proxy.Endpoint()},
		Logger:    zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: 200 * time.Millisecond,
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	opts := testOptions
	opts.RequestTimeout = 300 * time.Millisecond
	s, err := etcdstore.New(cli, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	observer := newStore(t, c) // a direct client: no outage
	ctx := ctxFor(t, 20*time.Second)
	key := uniqueKey(t, "abandoned")
	const ttl = 2 * time.Second // its lease: 3 s
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "t", TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	// Out of reach from 300 ms before the lock's TTL to 1.3 s after it.
	time.Sleep(ttl - 300*time.Millisecond)
	restore := proxy.cut()
	time.Sleep(1600 * time.Millisecond)
	restore()
	back := time.Now()
	for time.Since(back) < 4*time.Second {
		if _, err := observer.Inspect(ctx, key); errors.Is(err, leasehold.ErrNotHeld) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("a %v lock nobody renews still held 4s after an outage that its deletion fell into", ttl)
}

// A waiter whose grant was deleted before it took it acquires the free key
// afterwards; its retry then keeps that lock and fence (the grant it saw is
// not taken for its lock).
func TestRetryAfterALostGrant(t *testing.T) {
	c := testetcd.Start(t)
	ctx := ctxFor(t, 20*time.Second)
	holder, s := newStore(t, c), newStore(t, c)
	key := uniqueKey(t, "lostgrant")
	req := func(tok string) driver.AcquireRequest {
		return driver.AcquireRequest{Key: key, Token: tok, TTL: 10 * time.Second, QueueTTL: 3 * time.Second}
	}
	if _, err := holder.Acquire(ctx, req("h")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, req("w")); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	wake, stop, err := s.WaitRelease(ctx, key, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := holder.Release(ctx, key, "h"); err != nil {
		t.Fatal(err)
	}
	for w := (driver.Wake{}); w.Fence == 0; {
		select {
		case w = <-wake:
		case <-ctx.Done():
			t.Fatal("no grant")
		}
	}
	if _, err := holder.ForceRelease(ctx, key); err != nil {
		t.Fatal(err)
	}
	g, err := s.Acquire(ctx, req("w"))
	if err != nil {
		t.Fatalf("the free key after the lost grant: %v", err)
	}
	if again, err := s.Acquire(ctx, req("w")); err != nil || again.Fence != g.Fence {
		t.Fatalf("a retry of the holder: expected fence %d, got %+v, %v", g.Fence, again, err)
	}
}
