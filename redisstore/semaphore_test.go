package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
	"github.com/leasehold/leasehold/storetest"
)

// TestSemaphoreConformance runs the semaphore suite with every instance on
// its own go-redis client: separate replicas over one server.
func TestSemaphoreConformance(t *testing.T) {
	srv := testredis.Start(t)
	storetest.RunSemaphore(t, storetest.SemaphoreHarness{
		New:   func(t *testing.T) driver.Semaphorer { return newStore(t, srv.Client(t), redisstore.Options{}) },
		Break: func(t *testing.T, _ driver.Semaphorer) { srv.Stop() },
		Heal:  func(t *testing.T, _ driver.Semaphorer) { srv.Restart() },
	})
}

// TestSemaphoreCluster runs the suite on a three-master Cluster: every key of
// a semaphore is in one slot, or the scripts would fail with CROSSSLOT.
func TestSemaphoreCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	cl := testredis.StartCluster(t, 3)
	storetest.RunSemaphore(t, storetest.SemaphoreHarness{
		New:   func(t *testing.T) driver.Semaphorer { return newStore(t, cl.Client(t), redisstore.Options{}) },
		Slack: 5 * time.Second,
	})
}

// TestSemaphoreFenceAfterDataLoss: a restart without persistence loses every
// semaphore key; the next fence is still above every earlier one (the
// server-time floor).
func TestSemaphoreFenceAfterDataLoss(t *testing.T) {
	srv := testredis.Start(t)
	s := newStore(t, srv.Client(t), redisstore.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	req := driver.PermitRequest{Key: "k", Token: "a", TTL: time.Minute, Limit: 2}
	var last uint64
	for i := range 50 { // push the counter ahead of the clock floor
		req.Token = string(rune('a' + i%26))
		g, err := s.AcquirePermit(ctx, req)
		if err != nil {
			t.Fatalf("AcquirePermit %d: %v", i, err)
		}
		last = g.Fence
		if err := s.ReleasePermit(ctx, "k", req.Token); err != nil {
			t.Fatalf("ReleasePermit %d: %v", i, err)
		}
	}
	srv.Restart()
	var (
		g   driver.Grant
		err error
	)
	for range 50 { // the client reconnects
		if g, err = s.AcquirePermit(ctx, req); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("AcquirePermit after the restart: %v", err)
	}
	if g.Fence <= last {
		t.Fatalf("fence after data loss: expected > %d, got %d", last, g.Fence)
	}
}

// TestSemaphoreNoGarbage: once every permit is released and every waiter
// gone, only the fence floor (meta) is left, with an expiry.
func TestSemaphoreNoGarbage(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.Client(t)
	s := newStore(t, c, redisstore.Options{FenceRetention: time.Hour})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := s.AcquirePermit(ctx, driver.PermitRequest{Key: "k", Token: "a", TTL: time.Minute, Limit: 1}); err != nil {
		t.Fatal(err)
	}
	w := driver.PermitRequest{Key: "k", Token: "w", TTL: time.Minute, Limit: 1, QueueTTL: time.Minute}
	if _, err := s.AcquirePermit(ctx, w); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("waiter: expected ErrNotAcquired, got %v", err)
	}
	keys := s.SemaphoreKeys("k")
	for _, k := range keys {
		if ttl := c.PTTL(ctx, k).Val(); ttl <= 0 {
			t.Errorf("%s: expected an expiry, got PTTL %v", k, ttl)
		}
	}
	for _, tok := range []string{"a", "w"} {
		_ = s.ReleasePermit(ctx, "k", tok)
	}
	for i, k := range keys {
		n := c.Exists(ctx, k).Val()
		if want := map[bool]int64{true: 1, false: 0}[i == 2]; n != want {
			t.Errorf("%s: after every release expected exists=%d, got %d", k, want, n)
		}
	}
}
