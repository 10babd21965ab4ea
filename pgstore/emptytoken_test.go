package pgstore_test

import (
	"testing"
	"time"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/pgstore"
)

// A release keeps the key's row, free, with an empty token and the last
// fence: an Acquire with an empty token must not take that row as its own
// (the retry of a lost reply) and repeat the last holder's fence.
func TestEmptyTokenNeverRepeatsAFence(t *testing.T) {
	_, dsn := fresh(t)
	s := open(t, dsn, pgstore.Options{})
	ctx := ctx5(t)
	g, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	for _, store := range []*pgstore.Store{s, open(t, dsn, pgstore.Options{})} { // the fast path alone, and the full statement
		if g2, err := store.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "", TTL: time.Minute}); err == nil && g2.Fence <= g.Fence {
			t.Fatalf("Acquire with an empty token after the holder of fence %d released: expected an error or a larger fence, got fence %d", g.Fence, g2.Fence)
		}
	}
}
