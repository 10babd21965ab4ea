package etcdstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
)

// A permit waiter's watch that breaks for good (etcd compacted the revision
// it resumes from after a reconnect) is started again: the waiter is still
// woken when a permit is freed, not left to its polls.
func TestWaitPermitRestartsBrokenWatch(t *testing.T) {
	c := testetcd.Start(t)
	s, side := newStore(t, c), c.Client(t)
	ctx := ctxFor(t, 60*time.Second)
	key := uniqueKey(t, "sem")
	req := func(tok string) driver.PermitRequest {
		return driver.PermitRequest{Key: key, Token: tok, TTL: 30 * time.Second, Limit: 1, Holder: tok, QueueTTL: 30 * time.Second}
	}
	if _, err := s.AcquirePermit(ctx, req("h")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AcquirePermit(ctx, req("w")); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("expected the waiter queued, got %v", err)
	}
	wake, stop, err := s.WaitPermit(ctx, key, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	<-wake // a waiter's first wake-up comes at once
	var rev int64
	for range 5 { // revisions the watch never saw, then compacted
		r, err := side.Put(ctx, "lh-test-other", "x")
		if err != nil {
			t.Fatal(err)
		}
		rev = r.Header.Revision
	}
	if _, err := side.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	c.Kill(0)
	c.Restart(0)
	select {
	case <-wake: // the watch broke: re-check
	case <-time.After(20 * time.Second):
		t.Fatal("no wake-up after the watch broke")
	}
	time.Sleep(500 * time.Millisecond)
	select {
	case <-wake:
	default:
	}
	if err := s.ReleasePermit(ctx, key, "h"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not woken when the permit was freed after its watch broke")
	}
}
