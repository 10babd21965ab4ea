package etcdstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/etcdstore"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
	"github.com/leasehold/leasehold/storetest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// testOptions are the options of the tests' stores. The request timeout is
// longer than the default, so that 100 concurrent acquires under -race (the
// embedded members are instrumented too, three of them in the cluster suite)
// on a shared 2-core machine do not time out: 1.5 s did, for the first
// acquires of a round on the three-member cluster. A broken store is then
// reported by the caller's deadline where that is shorter, which the suite
// accepts as a store failure too (it only rules out ErrNotAcquired).
var testOptions = etcdstore.Options{Prefix: "lh-test/", RequestTimeout: 4 * time.Second}

// newStore returns a store over a fresh client of c, closed in t.Cleanup.
// startStore starts an etcd member and returns it, a raw client of it, a
// Store on it and a context that ends after d.
func startStore(t *testing.T, d time.Duration) (*testetcd.Cluster, *clientv3.Client, *etcdstore.Store, context.Context) {
	t.Helper()
	c := testetcd.Start(t)
	return c, c.Client(t), newStore(t, c), ctxFor(t, d)
}

func newStore(t *testing.T, c *testetcd.Cluster) *etcdstore.Store {
	t.Helper()
	s, err := newStoreTB(t, c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newStoreTB(tb testing.TB, c *testetcd.Cluster) (*etcdstore.Store, error) {
	s, err := etcdstore.New(c.Client(tb), testOptions)
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s, nil
}

// leftovers lists the keys under the test prefix and every lease of c.
func leftovers(c *testetcd.Cluster) func(t *testing.T) []string {
	return func(t *testing.T) []string {
		cli := c.Client(t)
		ctx := ctxFor(t, 10*time.Second)
		keys, err := cli.Get(ctx, "lh-test/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		ls, err := cli.Leases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, kv := range keys.Kvs {
			out = append(out, fmt.Sprintf("key %q", kv.Key))
		}
		for _, l := range ls.Leases {
			out = append(out, fmt.Sprintf("lease %x", l.ID))
		}
		return out
	}
}

func TestConformanceSingle(t *testing.T) {
	c := testetcd.Start(t)
	// The stores reach the member through a proxy that can freeze it.
	fz := startFreezer(t, c.Members[0].ClientURL)
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) driver.Store {
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{fz.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
			if err != nil {
				t.Fatal(err)
			}
			s, err := etcdstore.New(cli, testOptions)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close(); _ = cli.Close() })
			return s
		},
		Break:     func(t *testing.T, _ driver.Store) { c.Kill(0) },
		Heal:      func(t *testing.T, _ driver.Store) { c.Restart(0) },
		Freeze:    func(t *testing.T, _ driver.Store) func() { return fz.freeze() },
		Leftovers: leftovers(c),
		// etcd deletes a lock nobody renews with its lease: up to 1 s after
		// its TTL rounded up to whole seconds, plus etcd's 500 ms check.
		Slack: 3 * time.Second,
	})
}

func TestConformanceCluster(t *testing.T) {
	c := testetcd.StartCluster(t, 3)
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) driver.Store { return newStore(t, c) },
		// Losing two of three members loses the quorum: every call fails.
		Break:     func(t *testing.T, _ driver.Store) { c.Kill(1); c.Kill(2) },
		Heal:      func(t *testing.T, _ driver.Store) { c.Restart(1); c.Restart(2) },
		Leftovers: leftovers(c),
		Slack:     3 * time.Second,
	})
}
