package etcdstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
)

// Two Lockers with different WaiterTTLs on one Store: the longer one's
// KeepPresence must not end the places that the shorter one queued with
// Kept and keeps with its own KeepPresence every round (a place next in
// line is refreshed only every Kept/3).
func TestKeptPlaceOutlivesALongerPresence(t *testing.T) {
	c, _, s, ctx := startStore(t, 30*time.Second)
	h := newStore(t, c)
	key := uniqueKey(t, "k")
	if _, err := acquireQ(t, h, key, "h", 0); err != nil {
		t.Fatal(err)
	}
	const short, long = time.Second, 6 * time.Second
	if err := s.KeepPresence(ctx, short); err != nil { // A's keeper
		t.Fatal(err)
	}
	req := driver.AcquireRequest{Key: key, Token: "a", TTL: 10 * time.Second, QueueTTL: short, Kept: 20 * short}
	if _, err := s.Acquire(ctx, req); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	if err := s.KeepPresence(ctx, long); err != nil { // B's keeper
		t.Fatal(err)
	}
	for end := time.Now().Add(4 * long / 5); time.Now().Before(end); time.Sleep(short / 3) {
		if err := s.KeepPresence(ctx, short); err != nil { // A's keeper's rounds
			t.Fatal(err)
		}
	}
	errs := s.RefreshQueue(ctx, []driver.QueueRefresh{{Key: key, Token: "a", QueueTTL: short, Kept: 20 * short}})
	if errs[0] != nil {
		t.Fatalf("the place kept by A's presence: %v", errs[0])
	}
}
