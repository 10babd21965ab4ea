package etcdstore_test

import (
	"context"
	"errors"
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
)

// interceptedStore returns a store over its own client whose unary calls
// go through in.
func interceptedStore(t *testing.T, c *testetcd.Cluster, in grpc.UnaryClientInterceptor) *etcdstore.Store {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(in)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	s, err := etcdstore.New(cli, testOptions)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// lostReplyStore returns a store whose next transaction, once armed, is
// applied by etcd but answered with an error: a lost reply.
func lostReplyStore(t *testing.T, c *testetcd.Cluster) (*etcdstore.Store, *atomic.Bool) {
	t.Helper()
	armed := &atomic.Bool{}
	s := interceptedStore(t, c, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil && method == "/etcdserverpb.KV/Txn" && armed.CompareAndSwap(true, false) {
			return context.DeadlineExceeded
		}
		return err
	})
	return s, armed
}

// waitReq is a waiting acquire of key by token tok: TTL 10 s, queue TTL 3 s.
func waitReq(key, tok string) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Token: tok, TTL: 10 * time.Second, QueueTTL: 3 * time.Second}
}

// grantToWaiter has holder take key as "h" and s queue "w" behind it, then
// releases "h" and returns the grant w's subscription saw (its subscription
// then ends).
func grantToWaiter(ctx context.Context, t *testing.T, holder, s *etcdstore.Store, key string) driver.Wake {
	t.Helper()
	if _, err := holder.Acquire(ctx, waitReq(key, "h")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, waitReq(key, "w")); !errors.Is(err, leasehold.ErrNotAcquired) {
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
	return grantOn(t, ctx, wake)
}

// A granted waiter whose Acquire taking the grant lost its reply keeps the
// lock and the grant's fence on its retry.
func TestRetryAfterALostGrantTake(t *testing.T) {
	c := testetcd.Start(t)
	ctx := ctxFor(t, 20*time.Second)
	s, lose := lostReplyStore(t, c)
	key := uniqueKey(t, "lostgranttake")
	w := grantToWaiter(ctx, t, newStore(t, c), s, key)
	// The waiter's wait is over: it takes the grant.
	lose.Store(true)
	if _, err := s.Acquire(ctx, waitReq(key, "w")); err == nil {
		t.Fatal("expected the lost reply's error")
	}
	if g, err := s.Acquire(ctx, waitReq(key, "w")); err != nil || g.Fence != w.Fence {
		t.Fatalf("the retry after a lost reply: expected fence %d, got %+v, %v", w.Fence, g, err)
	}
	if r, err := c.Client(t).Get(ctx, "lh-test/"+key+"\x00", clientv3.WithPrefix()); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("the holder's retry: expected no queue entry, got %v, %v", r.Kvs, err)
	}
}

// A waiter whose grant was deleted before it took it, and which queued again,
// finds itself the holder when a later release grants it the key unseen (no
// watch): the grant it remembers is gone, not the lock.
func TestAcquireAfterAnUnseenSecondGrant(t *testing.T) {
	c := testetcd.Start(t)
	ctx := ctxFor(t, 20*time.Second)
	other, s := newStore(t, c), newStore(t, c)
	key := uniqueKey(t, "secondgrant")
	req := func(tok string) driver.AcquireRequest { return waitReq(key, tok) }
	grantToWaiter(ctx, t, other, s, key)
	if _, err := other.ForceRelease(ctx, key); err != nil { // the grant is gone
		t.Fatal(err)
	}
	if _, err := other.Acquire(ctx, req("u")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, req("w")); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("behind u: expected ErrNotAcquired, got %v", err)
	}
	if err := other.Release(ctx, key, "u"); err != nil { // grants w the key, unseen
		t.Fatal(err)
	}
	info, err := other.Inspect(ctx, key)
	if err != nil || info.Token != "w" {
		t.Fatalf("expected the key granted to w, got %+v, %v", info, err)
	}
	g, err := s.Acquire(ctx, req("w"))
	if err != nil || g.Fence != info.Fence {
		t.Fatalf("w's Acquire of the key granted to it: expected fence %d, got %+v, %v", info.Fence, g, err)
	}
	if err := s.Release(ctx, key, "w"); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Client(t).Get(ctx, "lh-test/"+key, clientv3.WithPrefix()); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("after w's Release: expected no lock and no queue entry, got %v, %v", r.Kvs, err)
	}
}

// A release grants the head the key on its queue entry's lease as it is now:
// the head refreshed its entry onto newer leases since the holder's acquire
// read it, and the lease it was on then expired.
func TestReleaseGrantsAfterTheHeadsLeaseMoved(t *testing.T) {
	c := testetcd.Start(t)
	ctx := ctxFor(t, 20*time.Second)
	a, s, w := newStore(t, c), newStore(t, c), newStore(t, c)
	key := uniqueKey(t, "headlease")
	wait := func(st *etcdstore.Store, tok string, queue time.Duration) error {
		_, err := st.Acquire(ctx, driver.AcquireRequest{Key: key, Token: tok, TTL: 10 * time.Second, QueueTTL: queue})
		return err
	}
	if err := wait(a, "a", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := wait(s, "h", 10*time.Second); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("h: expected ErrNotAcquired, got %v", err)
	}
	if err := wait(w, "w", time.Second); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("w: expected ErrNotAcquired, got %v", err)
	}
	if _, err := a.ForceRelease(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := wait(s, "h", 10*time.Second); err != nil { // the head of a free key, w behind it
		t.Fatal(err)
	}
	// w keeps its place on its 1 s queue TTL for 3 s: its first lease expires.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if err := wait(w, "w", time.Second); !errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("w: expected ErrNotAcquired, got %v", err)
		}
	}
	if err := s.Release(ctx, key, "h"); err != nil {
		t.Fatalf("h's Release: %v", err)
	}
	if info, err := a.Inspect(ctx, key); err != nil || info.Token != "w" {
		t.Fatalf("expected the key granted to w, got %+v, %v", info, err)
	}
}
