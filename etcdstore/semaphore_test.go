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
	"github.com/leasehold/leasehold/storetest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// TestSemaphoreConformance runs the semaphore suite with every instance on
// its own etcd client. etcd leases count whole seconds: TTLs of 1 s.
func TestSemaphoreConformance(t *testing.T) {
	c := testetcd.Start(t)
	storetest.RunSemaphore(t, storetest.SemaphoreHarness{
		New: func(t *testing.T) driver.Semaphorer {
			s, err := etcdstore.New(c.Client(t), testOptions)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Break:  func(t *testing.T, _ driver.Semaphorer) { c.Kill(0) },
		Heal:   func(t *testing.T, _ driver.Semaphorer) { c.Restart(0) },
		Slack:  2 * time.Second,
		MinTTL: time.Second,
	})
}

// An uncontended permit cycle costs two requests, as a lock cycle does: the
// grant's transaction (no read first: it grants on an empty semaphore; no
// LeaseGrant: the permit is on the store's shared lease) and the release's
// transaction. It was three (a LeaseGrant for each permit's own lease), and
// four before that (a read first on every acquire).
func TestPermitCycleRequests(t *testing.T) {
	c := testetcd.Start(t)
	cli, n := countingClient(t, c)
	s, err := etcdstore.New(cli, etcdstore.Options{Prefix: "lh-test/"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := ctxFor(t, 20*time.Second)
	cycle := func() {
		tok := leasehold.NewToken()
		if _, err := s.AcquirePermit(ctx, driver.PermitRequest{Key: "sem", Token: tok, TTL: 10 * time.Second, Limit: 2, Holder: "h"}); err != nil {
			t.Fatal(err)
		}
		if err := s.ReleasePermit(ctx, "sem", tok); err != nil {
			t.Fatal(err)
		}
	}
	cycle() // grants the store's lease
	n.take()
	const cycles = 20
	for range cycles {
		cycle()
	}
	got := n.take()
	delete(got, "/etcdserverpb.Lease/LeaseKeepAlive") // the session's background keep-alive
	if got["/etcdserverpb.KV/Txn"] != 2*cycles || len(got) != 1 {
		t.Fatalf("%d permit cycles: expected %d transactions, nothing else, got %v", cycles, 2*cycles, got)
	}
}

// The first transaction, which grants without a read, never admits a
// permit that another store's grant took: it requires no holder at all.
func TestPermitBoundSeesOtherStoresGrants(t *testing.T) {
	c := testetcd.Start(t)
	a, b := newStore(t, c), newStore(t, c)
	ctx := ctxFor(t, 20*time.Second)
	req := func(tok string) driver.PermitRequest {
		return driver.PermitRequest{Key: "sem", Token: tok, TTL: 10 * time.Second, Limit: 1, Holder: tok}
	}
	for _, tok := range []string{"a1", "a2"} { // a's bound: one free permit, guard known
		if _, err := a.AcquirePermit(ctx, req(tok)); err != nil {
			t.Fatal(err)
		}
		if err := a.ReleasePermit(ctx, "sem", tok); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.AcquirePermit(ctx, req("b")); err != nil {
		t.Fatal(err)
	}
	if g, err := a.AcquirePermit(ctx, req("a3")); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("a permit while another store's holder has the only one: expected ErrNotAcquired, got fence %d, %v", g.Fence, err)
	}
	// After b's release, a's next acquire reads and takes it.
	if err := b.ReleasePermit(ctx, "sem", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AcquirePermit(ctx, req("a3")); err != nil {
		t.Fatalf("after the release: %v", err)
	}
}

// A semaphore that other acquirers change between every read and grant is
// contention (ErrNotAcquired), not a store failure: every attempt got an
// answer. It was a store failure ("semaphore changed under every attempt"),
// which failed a Locker's Acquire with 16 contenders in the permit
// benchmark.
func TestPermitRetriesRunOutAsContention(t *testing.T) {
	c := testetcd.Start(t)
	side := c.Client(t)
	var (
		armed atomic.Bool
		guard atomic.Value // the guard key, once the store exists
	)
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if armed.Load() && method == "/etcdserverpb.KV/Txn" {
					// Another acquirer rewrites the guard before every transaction.
					if _, err := side.Put(ctx, guard.Load().(string), "1"); err != nil {
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
	s, err := etcdstore.New(cli, etcdstore.Options{Prefix: "lh-test/", RequestTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	guard.Store(s.SemaphorePrefix("sem") + "g")
	// A holder first: the first transaction, which grants on an empty
	// semaphore without comparing the guard, finds it not empty.
	if _, err := s.AcquirePermit(ctxFor(t, 10*time.Second), driver.PermitRequest{Key: "sem", Token: "first", TTL: 10 * time.Second, Limit: 2, Holder: "h"}); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	_, err = s.AcquirePermit(ctxFor(t, 60*time.Second), driver.PermitRequest{Key: "sem", Token: "t", TTL: 10 * time.Second, Limit: 2, Holder: "h"})
	if !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("a semaphore changed by others under every attempt: expected ErrNotAcquired (contention), got %v", err)
	}
}
