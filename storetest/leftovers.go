package storetest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
)

// nothingLeftAfterClose checks that a store leaves no server-side state
// behind once it is closed: released, expired, held and queued locks, a
// waiter's subscription, and a Locker's locks all end with the stores that
// made them. Harness.Leftovers lists
// what is left (documented fence state excepted); it runs after the
// cleanups of a nested subtest closed every store it created.
func (r *runner) nothingLeftAfterClose(t *testing.T) {
	if r.h.Leftovers == nil {
		t.Skip("Harness.Leftovers is nil")
	}
	t.Run("work", func(t *testing.T) {
		s1, s2 := r.store(t), r.store(t)
		ctx := ctxFor(t, 20*time.Second)
		for i := range 20 { // released
			key, tok := r.key(t, fmt.Sprintf("cycle%d", i%4)), fmt.Sprintf("t%d", i)
			mustAcquire(t, s1, key, tok, time.Duration(1+i%3)*time.Second)
			if i%2 == 0 {
				if err := s1.Renew(ctx, key, tok, time.Minute); err != nil {
					t.Fatalf("Renew: %v", err)
				}
			}
			mustRelease(t, s1, key, tok)
		}
		held := r.key(t, "held") // held at Close, with a waiter queued
		mustAcquire(t, s1, held, "holder", time.Minute)
		_, err := s2.Acquire(ctx, driver.AcquireRequest{Key: held, Token: "waiter", TTL: time.Minute, QueueTTL: time.Minute})
		if !errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("waiting Acquire of a held key: expected ErrNotAcquired, got %v", err)
		}
		if n, ok := s2.(driver.Notifier); ok { // a waiter's subscription, stopped before Close
			_, stop, err := n.WaitRelease(ctx, held, "waiter")
			if err != nil {
				t.Fatalf("WaitRelease: %v", err)
			}
			t.Cleanup(stop) // runs before the stores' Close (cleanups run last in, first out)
		}
		mustAcquire(t, s2, r.key(t, "expired"), "x", 50*time.Millisecond) // left to expire
		lk, err := leasehold.New(s2, leasehold.Options{Name: "storetest", TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lk.TryAcquire(ctx, r.key(t, "locker")); err != nil {
			t.Fatalf("Locker.TryAcquire: %v", err)
		}
		if err := lk.Close(); err != nil {
			t.Fatalf("Locker.Close: %v", err)
		}
		time.Sleep(200*time.Millisecond + r.h.Slack)
	})
	if left := r.h.Leftovers(t); len(left) > 0 {
		t.Fatalf("after every store was closed: expected no server-side state, got %d: %s", len(left), strings.Join(left, "; "))
	}
}
