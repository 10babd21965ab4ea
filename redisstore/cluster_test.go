package redisstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
	"github.com/leasehold/leasehold/storetest"
)

// TestCluster runs the conformance suite on a three-master Redis Cluster and
// checks that locks spread over the masters and List finds them on all.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	cl := testredis.StartCluster(t, 3)
	cc := cl.Client(t)

	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) leasehold.Store { return newStore(t, cc, redisstore.Options{}) },
		Break: func(t *testing.T, _ leasehold.Store) {
			for _, n := range cl.Nodes {
				n.Stop()
			}
		},
		Heal: func(t *testing.T, _ leasehold.Store) {
			for _, n := range cl.Nodes { // nodes.conf in each node's dir keeps the slots
				n.Restart()
			}
		},
		Slack: 10 * time.Second,
	})

	t.Run("ListEveryMaster", func(t *testing.T) {
		s := newStore(t, redis.UniversalClient(cc), redisstore.Options{})
		ctx := t.Context()
		const n = 60
		for i := range n {
			if _, err := s.Acquire(ctx, leasehold.AcquireRequest{Key: fmt.Sprintf("spread:%02d", i), Token: "t", TTL: time.Minute}); err != nil {
				t.Fatal(err)
			}
		}
		var masters, withLocks atomic.Int32
		err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			masters.Add(1)
			keys, _, err := m.Scan(ctx, 0, "leasehold:{spread:*}:lock", 1000).Result()
			if len(keys) > 0 {
				withLocks.Add(1)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if masters.Load() != 3 || withLocks.Load() < 2 {
			t.Fatalf("expected locks on at least 2 of 3 masters, got %d of %d", withLocks.Load(), masters.Load())
		}
		ls, err := s.List(ctx, "spread:")
		if err != nil {
			t.Fatal(err)
		}
		if len(ls) != n {
			t.Fatalf("List on the cluster: expected %d locks, got %d", n, len(ls))
		}
		for i, l := range ls {
			if want := fmt.Sprintf("spread:%02d", i); l.Key != want || l.Fence == 0 {
				t.Fatalf("List[%d]: expected %s with a fence, got %+v", i, want, l)
			}
		}
	})
}
