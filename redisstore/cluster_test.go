package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
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

	t.Run("BraceKeys", func(t *testing.T) { testBraceKeys(t, cl) })
	t.Run("CrossSlotIsMisconfigured", func(t *testing.T) {
		// The store's names cannot cross slots; a real CROSSSLOT reply is
		// still classified as a configuration error.
		err := cc.Eval(t.Context(), "return 1", []string{"a", "b"}).Err()
		if !redis.HasErrorPrefix(err, "CROSSSLOT") {
			t.Fatalf("EVAL over keys a and b: expected CROSSSLOT, got %v", err)
		}
		s := newStore(t, cc, redisstore.Options{})
		if got := s.Classify("acquire", "k", err); !errors.Is(got, leasehold.ErrMisconfigured) {
			t.Fatalf("CROSSSLOT: expected ErrMisconfigured, got %v", got)
		}
	})
	storetest.Run(t, storetest.Harness{
		New:    func(t *testing.T) driver.Store { return newStore(t, newClusterClient(t, cl), redisstore.Options{}) },
		Freeze: func(t *testing.T, _ driver.Store) func() { return freezeAll(cl) },
		Break: func(t *testing.T, _ driver.Store) {
			for _, n := range cl.Nodes {
				n.Stop()
			}
		},
		Heal: func(t *testing.T, _ driver.Store) {
			for _, n := range cl.Nodes { // nodes.conf in each node's dir keeps the slots
				n.Restart()
			}
		},
		Slack: 10 * time.Second,
		Leftovers: func(t *testing.T) []string {
			var out []string
			for _, n := range cl.Nodes { // every node: SCAN and PUBSUB answer for one node only
				c := newClient(t, n.Addr)
				if role, err := c.Do(t.Context(), "ROLE").Slice(); err != nil || len(role) == 0 || role[0] != "master" {
					continue
				}
				out = append(out, leftovers(t, c)...)
			}
			return out
		},
	})

	t.Run("ListEveryMaster", func(t *testing.T) { listEveryMaster(t, cc) })
}

// newClusterClient returns a cluster client of its own, with context
// deadlines on, closed in t.Cleanup.
func newClusterClient(t *testing.T, cl *testredis.Cluster) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// testBraceKeys checks keys that would break a naive {KEY} hash tag (a '}'
// first, braces inside, a literal escape sequence): every operation works on
// the Cluster, lock, fence and queue share a slot, and a queued waiter is
// woken through the key's sharded channel.
func testBraceKeys(t *testing.T, cl *testredis.Cluster) {
	a := newStore(t, newClusterClient(t, cl), redisstore.Options{})
	b := newStore(t, newClusterClient(t, cl), redisstore.Options{})
	ctx := t.Context()
	keys := []string{"}job", "{x}y", "a}{b", "}{", "%7D", "}%"}
	for _, key := range keys {
		braceKey(t, a, b, key)
	}
	ls, err := a.List(ctx, "}")
	if err != nil || len(ls) != 3 || ls[0].Key != "}%" || ls[1].Key != "}job" || ls[2].Key != "}{" {
		t.Fatalf(`List("}"): expected }%%, }job, }{, got %+v, %v`, ls, err)
	}
}

// braceKey runs one key through acquire, queue, inspect, release, wake-up
// and the head's grant.
func braceKey(t *testing.T, a, b *redisstore.Store, key string) {
	t.Helper()
	ctx := t.Context()
	g, err := a.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "a", TTL: time.Minute, Holder: "host-a"})
	if err != nil {
		t.Fatalf("Acquire(%q) on the Cluster: %v", key, err)
	}
	wake, stop, err := b.WaitRelease(ctx, key, "b")
	if err != nil {
		t.Fatalf("WaitRelease(%q): %v", key, err)
	}
	defer stop()
	select { // a wake-up at once, if any: the key is held by a, so none is due (see driver.Notifier)
	case <-wake:
	default:
	}
	wait := driver.AcquireRequest{Key: key, Token: "b", TTL: time.Minute, QueueTTL: time.Minute}
	if _, err := b.Acquire(ctx, wait); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("Acquire(%q) by a waiter: expected ErrNotAcquired, got %v", key, err)
	}
	info, err := b.Inspect(ctx, key)
	if err != nil || info.Key != key || info.Fence != g.Fence || info.Holder != "host-a" || info.Waiting != 1 {
		t.Fatalf("Inspect(%q): expected the lock with fence %d and 1 waiter, got %+v, %v", key, g.Fence, info, err)
	}
	if err := a.Release(ctx, key, "a"); err != nil {
		t.Fatalf("Release(%q): %v", key, err)
	}
	select {
	case <-wake:
	case <-time.After(5 * time.Second):
		t.Fatalf("%q: the queued waiter was not woken within 5s of the release", key)
	}
	if _, err := b.Acquire(ctx, wait); err != nil {
		t.Fatalf("Acquire(%q) by the woken head: %v", key, err)
	}
}

// freezeAll freezes every node; the returned func thaws them.
func freezeAll(cl *testredis.Cluster) (thaw func()) {
	var thaws []func()
	for _, n := range cl.Nodes {
		thaws = append(thaws, n.Freeze())
	}
	return func() {
		for _, thaw := range thaws {
			thaw()
		}
	}
}

// listEveryMaster checks that locks spread over the masters and that List
// finds them on all.
func listEveryMaster(t *testing.T, cc *redis.ClusterClient) {
	s := newStore(t, redis.UniversalClient(cc), redisstore.Options{})
	ctx := t.Context()
	const n = 60
	for i := range n {
		// The suite's last subtest restarted every node: wait until every slot is served again.
		deadline := time.Now().Add(20 * time.Second)
		for {
			_, err := s.Acquire(ctx, driver.AcquireRequest{Key: fmt.Sprintf("spread:%02d", i), Token: "t", TTL: time.Minute})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
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
}
