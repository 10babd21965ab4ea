package etcdstore_test

import (
	"context"
	"errors"
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
)

// lateTxns is a client whose next transaction, once armed, fails at once for
// its caller (as when the caller's context ends) but reaches etcd later, as
// a request still in flight does: etcd applies it after whatever the caller
// sends next.
type lateTxns struct {
	armed atomic.Bool
	wg    sync.WaitGroup
	done  chan struct{} // closed when the late transaction was answered
}

func lateClient(t *testing.T, c *testetcd.Cluster, delay time.Duration) (*clientv3.Client, *lateTxns) {
	t.Helper()
	lt := &lateTxns{done: make(chan struct{})}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if method != "/etcdserverpb.KV/Txn" || !lt.armed.CompareAndSwap(true, false) {
					return invoker(ctx, method, req, reply, cc, opts...)
				}
				lt.wg.Go(func() {
					defer close(lt.done)
					time.Sleep(delay)
					_ = invoker(context.WithoutCancel(ctx), method, req, reply, cc, opts...)
				})
				return context.Canceled
			}),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lt.wg.Wait(); _ = cli.Close() })
	return cli, lt
}

// gone waits until etcdKey no longer exists and returns how long that took
// from start, or fails the test after limit.
func gone(t *testing.T, cli *clientv3.Client, etcdKey string, start time.Time, limit time.Duration) time.Duration {
	t.Helper()
	ctx := ctxFor(t, limit+10*time.Second)
	for {
		r, err := cli.Get(ctx, etcdKey, clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if r.Count == 0 {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("%q still exists %v after its owner stopped renewing it", etcdKey, time.Since(start).Round(time.Millisecond))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// keepRenewing holds another lock of the store with the same TTL and renews
// it until the test ends, as a busy process does.
func keepRenewing(t *testing.T, s *etcdstore.Store, ttl time.Duration) {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	key := uniqueKey(t, "busy")
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "busy", TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(ttl / 4):
			}
			if err := s.Renew(ctx, key, "busy", ttl); err != nil && ctx.Err() == nil {
				t.Errorf("renewing the busy lock: %v", err)
				return
			}
		}
	})
	t.Cleanup(func() { close(stop); wg.Wait() })
}

// An acquire whose caller gave up while its transaction was in flight, and
// whose clean-up Release reached etcd first, leaves a lock nobody owns: etcd
// deletes it at its TTL, although the store's other locks stay renewed.
func TestRacedReleaseLockExpires(t *testing.T) {
	c := testetcd.Start(t)
	cli, late := lateClient(t, c, 300*time.Millisecond)
	s, err := etcdstore.New(cli, testOptions)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	const ttl = 2 * time.Second
	keepRenewing(t, s, ttl)
	ctx := ctxFor(t, 30*time.Second)
	key, tok := uniqueKey(t, "orphan"), leasehold.NewToken()
	late.armed.Store(true)
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: tok, TTL: ttl}); err == nil {
		t.Fatal("acquire: expected the caller's error, got a lease")
	}
	if err := s.Release(ctx, key, tok); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("release before the acquire applied: expected ErrNotHeld, got %v", err)
	}
	<-late.done
	applied := time.Now()
	raw := c.Client(t)
	if r, err := raw.Get(ctx, "lh-test/"+key); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("the late acquire: expected it applied, got %v, %v", r, err)
	}
	// etcd: the lease's TTL (whole seconds + 1) plus its 500 ms expiry check.
	took := gone(t, raw, "lh-test/"+key, applied, ttl+2*time.Second)
	t.Logf("orphan lock deleted %v after the late acquire applied (TTL %v)", took.Round(time.Millisecond), ttl)
}

// The same for a waiter's queue entry: a waiting acquire that gave up in
// flight, whose Release (leaving the queue) came first, leaves an entry
// that etcd deletes at its queue TTL.
func TestRacedReleaseQueueEntryExpires(t *testing.T) {
	c := testetcd.Start(t)
	cli, late := lateClient(t, c, 300*time.Millisecond)
	s, err := etcdstore.New(cli, testOptions)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	holder := newStore(t, c)
	const ttl = 2 * time.Second
	keepRenewing(t, s, ttl)
	ctx := ctxFor(t, 30*time.Second)
	key, tok := uniqueKey(t, "queued"), leasehold.NewToken()
	if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	late.armed.Store(true)
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: tok, TTL: ttl, QueueTTL: ttl}); err == nil || errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("waiting acquire: expected the caller's error, got %v", err)
	}
	if err := s.Release(ctx, key, tok); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("leaving the queue before the acquire applied: expected ErrNotOwned, got %v", err)
	}
	<-late.done
	applied := time.Now()
	raw := c.Client(t)
	entry := "lh-test/" + key + "\x00" + tok
	if r, err := raw.Get(ctx, entry); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("the late acquire: expected its queue entry, got %v, %v", r, err)
	}
	took := gone(t, raw, entry, applied, ttl+2*time.Second)
	t.Logf("orphan queue entry deleted %v after the late acquire applied (queue TTL %v)", took.Round(time.Millisecond), ttl)
}
