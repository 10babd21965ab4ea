package etcdstore_test

import (
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/etcdstore"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
	"github.com/leasehold/leasehold/storetest"
)

// newStore returns a store over a fresh client of c, closed in t.Cleanup.
func newStore(t *testing.T, c *testetcd.Cluster) *etcdstore.Store {
	t.Helper()
	s, err := newStoreTB(t, c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newStoreTB(tb testing.TB, c *testetcd.Cluster) (*etcdstore.Store, error) {
	s, err := etcdstore.New(c.Client(tb), etcdstore.Options{Prefix: "lh-test/"})
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s, nil
}

func TestConformanceSingle(t *testing.T) {
	c := testetcd.Start(t)
	storetest.Run(t, storetest.Harness{
		New:   func(t *testing.T) leasehold.Store { return newStore(t, c) },
		Break: func(t *testing.T, _ leasehold.Store) { c.Kill(0) },
		Heal:  func(t *testing.T, _ leasehold.Store) { c.Restart(0) },
		Slack: 2 * time.Second, // TTLs are whole seconds in etcd
	})
}

func TestConformanceCluster(t *testing.T) {
	c := testetcd.StartCluster(t, 3)
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) leasehold.Store { return newStore(t, c) },
		// Losing two of three members loses the quorum: every call fails.
		Break: func(t *testing.T, _ leasehold.Store) { c.Kill(1); c.Kill(2) },
		Heal:  func(t *testing.T, _ leasehold.Store) { c.Restart(1); c.Restart(2) },
		Slack: 2 * time.Second,
	})
}
