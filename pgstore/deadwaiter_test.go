package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

// TestDeadWaiterHoldsQueueOnlyQueueTTL: a waiter joins the queue, subscribes
// with WaitRelease as the Locker does, and dies without a word (its process
// crashed, or the database went away so its clean-up failed). Its place must
// lapse QueueTTL after its last refresh. The subscription's five-minute
// lifetime used to be copied onto the queued entry, so a dead waiter blocked
// the key for five minutes; with Options.Durable that survived a database
// crash and stalled every waiter (TestPrimaryCrashRestart found it).
func TestDeadWaiterHoldsQueueOnlyQueueTTL(t *testing.T) {
	srv := testpg.Start(t)
	s := open(t, srv.DSN(), pgstore.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	const key, queueTTL = "dead-waiter", 500 * time.Millisecond
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "holder", TTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	_, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "dead", TTL: 10 * time.Second, QueueTTL: queueTTL})
	if !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("waiter: %v, want ErrNotAcquired", err)
	}
	_, stop, err := s.WaitRelease(ctx, key, "dead")
	if err != nil {
		t.Fatal(err)
	}
	stop() // the waiter is gone; its rows stay behind
	if err := s.Release(ctx, key, "holder"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(queueTTL + 200*time.Millisecond)
	g, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "next", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("the key is still blocked %v after the dead waiter's QueueTTL (%v): %v (%d ahead)", queueTTL+200*time.Millisecond, queueTTL, err, g.Ahead)
	}
}
