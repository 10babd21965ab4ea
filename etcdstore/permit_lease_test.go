package etcdstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/calibrate"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/etcdstore"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// A permit lives on the store's shared lease, which the store keeps alive
// for its other permits and locks: the store itself deletes a permit nobody
// renews at its TTL, and its holder's next renewal reports the loss
// (ErrNotOwned), while a renewed permit on the same lease lives on.
func TestPermitUnrenewedSweptAtTTL(t *testing.T) {
	c := testetcd.Start(t)
	s := newStore(t, c)
	ctx := ctxFor(t, 20*time.Second)
	const ttl = time.Second
	req := func(tok string) driver.PermitRequest {
		return driver.PermitRequest{Key: "sem", Token: tok, TTL: ttl, Limit: 4, Holder: tok}
	}
	start := time.Now()
	if _, err := s.AcquirePermit(ctx, req("kept")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AcquirePermit(ctx, req("dropped")); err != nil {
		t.Fatal(err)
	}
	hk := s.SemaphorePrefix("sem") + "h/dropped"
	var gone time.Duration
	for gone == 0 {
		if time.Since(start) > 5*ttl {
			t.Fatalf("an unrenewed permit still there after %v (TTL %v)", time.Since(start), ttl)
		}
		if err := s.RenewPermit(ctx, "sem", "kept", ttl); err != nil {
			t.Fatalf("renewing the other permit: %v", err)
		}
		r, err := s.Client().Get(ctx, hk)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Kvs) == 0 {
			gone = time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if gone < ttl {
		t.Fatalf("the unrenewed permit was deleted after %v, before its TTL %v", gone, ttl)
	}
	if err := s.RenewPermit(ctx, "sem", "dropped", ttl); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("renewing the swept permit: expected ErrNotOwned, got %v", err)
	}
	info, err := s.Permits(ctx, "sem")
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Holders) != 1 || info.Holders[0].Token != "kept" || info.Holders[0].Remaining > ttl {
		t.Fatalf("expected the renewed permit alone, Remaining at most its TTL, got %+v", info.Holders)
	}
	t.Logf("unrenewed permit deleted %v after its acquire (TTL %v)", gone, ttl)
}

// A grant read while the semaphore had no guard must not be admitted when,
// before its transaction, another store granted a permit and the guard
// then disappeared (its lease ended). The guard's "absent" compares equal
// again; without more, the stale read admitted a third holder under limit 2.
func TestPermitGrantWithoutGuardSeesNewHolders(t *testing.T) {
	c := testetcd.Start(t)
	side := c.Client(t)
	a := newStore(t, c)
	var armed atomic.Bool
	var hook func(context.Context) error
	cli := beforeSecondTxn(t, c, &armed, func(ctx context.Context) error { return hook(ctx) })
	s, err := etcdstore.New(cli, etcdstore.Options{Prefix: "lh-test/", RequestTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	req := func(tok string) driver.PermitRequest {
		return driver.PermitRequest{Key: "sem", Token: tok, TTL: 10 * time.Second, Limit: 2, Holder: tok}
	}
	gk := s.SemaphorePrefix("sem") + "g"
	ctx := ctxFor(t, 20*time.Second)
	// A holder and no guard: the first transaction (a grant on an empty
	// semaphore) fails and reads that; the second grants on the read.
	if _, err := a.AcquirePermit(ctx, req("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := side.Delete(ctx, gk); err != nil {
		t.Fatal(err)
	}
	hook = func(ctx context.Context) error {
		if _, err := a.AcquirePermit(ctx, req("a")); err != nil {
			return err
		}
		_, err := side.Delete(ctx, gk)
		return err
	}
	armed.Store(true)
	g, err := s.AcquirePermit(ctx, req("stale"))
	if err == nil {
		t.Fatalf("a grant on a read from before another store's grant: admitted (fence %d) beside holders x and a under limit 2", g.Fence)
	}
	if !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	info, err := s.Permits(ctx, "sem")
	if err != nil || len(info.Holders) != 2 || info.Holders[0].Token != "x" || info.Holders[1].Token != "a" {
		t.Fatalf("expected holders x and a, got %+v, %v", info.Holders, err)
	}
}

// beforeSecondTxn returns a client that, once armed, runs hook before its
// second transaction.
func beforeSecondTxn(t *testing.T, c *testetcd.Cluster, armed *atomic.Bool, hook func(context.Context) error) *clientv3.Client {
	t.Helper()
	var txns atomic.Int32
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if armed.Load() && method == "/etcdserverpb.KV/Txn" && txns.Add(1) == 2 {
					if err := hook(ctx); err != nil {
						return err
					}
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// A waiter takes a dead holder's permit at about the permit's TTL, not when
// etcd expires the holder's shared lease (TTL + 1 s after its last
// keep-alive, checked every 500 ms), and never before the holder's own
// expiry guard stopped trusting it.
func TestCrashedPermitTakenOverAtItsTTL(t *testing.T) {
	c := testetcd.Start(t)
	const ttl = time.Second
	drift := calibrate.DriftMargin(ttl)
	for i := range 3 {
		holder, crash := crashable(t, c)
		waiter := newStore(t, c)
		lk := newLocker(t, waiter, leasehold.Options{Name: "waiter", TTL: ttl})
		key := uniqueKey(t, "k")
		ctx := ctxFor(t, 10*time.Second)
		warm(t, holder, key+"-warm") // the holder's shared lease exists, as in steady use
		sem, err := lk.Semaphore(key, 1)
		if err != nil {
			t.Fatal(err)
		}
		sent := time.Now()
		g, err := holder.AcquirePermit(ctx, driver.PermitRequest{Key: key, Token: "dead", TTL: ttl, Limit: 1, Holder: "dead"})
		if err != nil {
			t.Fatal(err)
		}
		crash()
		permit, err := sem.Acquire(ctx)
		if err != nil {
			t.Fatalf("run %d: the waiter: %v", i, err)
		}
		late := time.Since(sent.Add(ttl))
		t.Logf("run %d: taken over %v after the holder's TTL", i, late)
		if late < -drift {
			t.Fatalf("run %d: taken over %v before the holder's TTL, while its guard (drift margin %v) still trusted it", i, -late, drift)
		}
		if late > 500*time.Millisecond {
			t.Fatalf("run %d: taken over %v after the holder's TTL, expected about at it", i, late)
		}
		if permit.Fence() <= g.Fence {
			t.Fatalf("run %d: fence %d not above the dead holder's %d", i, permit.Fence(), g.Fence)
		}
		if err := permit.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A holder that keeps renewing is never taken over, however long a waiter
// waits: each renewal that sees a waiter writes the holder key.
func TestRenewedPermitNotTakenOver(t *testing.T) {
	c := testetcd.Start(t)
	const ttl = time.Second
	holder, waiter := newStore(t, c), newStore(t, c)
	lk, err := leasehold.New(waiter, leasehold.Options{Name: "waiter", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk.Close() })
	key := uniqueKey(t, "k")
	ctx := ctxFor(t, 20*time.Second)
	if _, err := holder.AcquirePermit(ctx, driver.PermitRequest{Key: key, Token: "alive", TTL: ttl, Limit: 1, Holder: "alive"}); err != nil {
		t.Fatal(err)
	}
	sem, err := lk.Semaphore(key, 1)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 3*ttl)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		p, err := sem.Acquire(wctx)
		if err == nil {
			_ = p.Release(ctx)
		}
		got <- err
	}()
	for wctx.Err() == nil {
		if err := holder.RenewPermit(ctx, key, "alive", ttl); err != nil {
			t.Fatalf("renewal while a waiter waits: %v", err)
		}
		time.Sleep(ttl / 4)
	}
	if err := <-got; err == nil {
		t.Fatal("the waiter took the permit of a holder that kept renewing it")
	}
	if err := holder.RenewPermit(ctx, key, "alive", ttl); err != nil {
		t.Fatalf("renewal after the wait: %v", err)
	}
}

// RequestTimeout bounds each request, not an AcquirePermit that keeps
// losing its optimistic transaction to other acquirers: those answers are
// contention (ErrNotAcquired), never an outage (ErrUnavailable, which a
// FailOpen locker turns into a permit outside the limit). Here every
// transaction is answered within 20 ms and loses; the 32 of them took longer
// than the 500 ms RequestTimeout together.
func TestPermitRetriesAreNotAnOutage(t *testing.T) {
	c := testetcd.Start(t)
	side := c.Client(t)
	a := newStore(t, c)
	var armed atomic.Bool
	var gk string
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if armed.Load() && method == "/etcdserverpb.KV/Txn" {
					// Another acquirer changes the semaphore first, on a
					// cluster that takes 20 ms to answer.
					if _, err := side.Put(ctx, gk, "2"); err != nil {
						return err
					}
					time.Sleep(20 * time.Millisecond)
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	s, err := etcdstore.New(cli, etcdstore.Options{Prefix: "lh-test/", RequestTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	key := uniqueKey(t, "sem")
	gk = s.SemaphorePrefix(key) + "g"
	req := func(tok string) driver.PermitRequest {
		return driver.PermitRequest{Key: key, Token: tok, TTL: 10 * time.Second, Limit: 2, Holder: tok}
	}
	ctx := ctxFor(t, 20*time.Second)
	if _, err := a.AcquirePermit(ctx, req("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AcquirePermit(ctx, req("warm")); err != nil { // the store's lease exists
		t.Fatal(err)
	}
	if err := s.ReleasePermit(ctx, key, "warm"); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	start := time.Now()
	_, err = s.AcquirePermit(ctx, req("y"))
	took := time.Since(start)
	if errors.Is(err, leasehold.ErrUnavailable) || !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("an acquire that lost every transaction to other acquirers for %v: expected ErrNotAcquired (contention), got %v", took, err)
	}
	t.Logf("lost every transaction for %v: %v", took, err)
}
