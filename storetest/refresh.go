package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/driver"
)

// queueRefresh checks driver.QueueRefresher, for stores that have it: a
// refresh keeps a live place (and only a live one: it never creates an
// entry), answers ErrNotQueued for a token without a place and ErrNotHeld
// for a free key, never grants, and a place whose refreshes stop is still
// expired by the store.
func (r *runner) queueRefresh(t *testing.T) {
	rs := r.replicas(t, 3)
	rq, ok := rs[1].(driver.QueueRefresher)
	if !ok {
		t.Skip("store does not implement driver.QueueRefresher")
	}
	key, other := r.key(t, "k"), r.key(t, "free")
	const short = time.Second // the coarsest waiter TTL a store may round to
	refresh := func(reqs ...driver.QueueRefresh) []error {
		t.Helper()
		errs := rq.RefreshQueue(ctxFor(t, 5*time.Second), reqs)
		if len(errs) != len(reqs) {
			t.Fatalf("RefreshQueue of %d: expected %d results, got %d", len(reqs), len(reqs), len(errs))
		}
		return errs
	}
	waiting := func(want int, when string) {
		t.Helper()
		info, err := rs[0].Inspect(ctxFor(t, 5*time.Second), key)
		if err != nil || info.Waiting != want {
			t.Fatalf("%s: expected %d waiting, got %+v, %v", when, want, info, err)
		}
	}
	holderTTL := 4*short + r.h.Slack
	mustAcquire(t, rs[0], key, "h", holderTTL)
	held := time.Now()
	w := waitReq(key, "w")
	w.QueueTTL = short
	mustQueue(t, rs[1], w, 0)
	mustQueue(t, rs[2], waitReq(key, "w2"), 1)

	errs := refresh(driver.QueueRefresh{Key: key, Token: "w", QueueTTL: short},
		driver.QueueRefresh{Key: key, Token: "nobody", QueueTTL: short},
		driver.QueueRefresh{Key: other, Token: "w", QueueTTL: short})
	if errs[0] != nil || !errors.Is(errs[1], driver.ErrNotQueued) || !errors.Is(errs[2], driver.ErrNotQueued) {
		t.Fatalf("RefreshQueue of a queued token, of an unknown one, of a key without queue: expected nil, ErrNotQueued, ErrNotQueued, got %v", errs)
	}
	waiting(2, "after refreshing one queued and two unknown tokens")
	if _, err := rs[0].Inspect(ctxFor(t, 5*time.Second), other); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("RefreshQueue of a key without queue left something: expected ErrNotHeld from Inspect, got %v", err)
	}

	// Refreshed every short/4 until the holder's lock expired (4×short),
	// the place outlives its queue TTL.
	expired := held.Add(holderTTL + 100*time.Millisecond)
	for time.Now().Before(expired.Add(-short / 2)) {
		if err := refresh(driver.QueueRefresh{Key: key, Token: "w", QueueTTL: short})[0]; err != nil {
			t.Fatalf("RefreshQueue of a place refreshed every %v (queue TTL %v): expected nil, got %v", short/4, short, err)
		}
		time.Sleep(short / 4)
	}
	waiting(2, "after refreshes past the place's first deadline")
	mustQueue(t, rs[2], waitReq(key, "w2"), 1) // still behind w

	// The holder's lock expires: the refresh says so and grants nothing.
	time.Sleep(time.Until(expired))
	if err := refresh(driver.QueueRefresh{Key: key, Token: "w", QueueTTL: short})[0]; !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("RefreshQueue of the head of a free key: expected ErrNotHeld, got %v", err)
	}
	if info, err := rs[0].Inspect(ctxFor(t, 5*time.Second), key); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("RefreshQueue granted the key: expected ErrNotHeld from Inspect, got %+v, %v", info, err)
	}

	// Refreshes stop: the store drops the place within its queue TTL.
	stopped := time.Now()
	for {
		if heads(t, rs[2], key, "w2") {
			break
		}
		if time.Since(stopped) > short+time.Second+r.h.Slack {
			t.Fatalf("a place whose refreshes stopped (queue TTL %v) still holds the queue after %v", short, time.Since(stopped))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if errs := refresh(driver.QueueRefresh{Key: key, Token: "w", QueueTTL: short}); !errors.Is(errs[0], driver.ErrNotQueued) {
		t.Fatalf("RefreshQueue of an expired place: expected ErrNotQueued (and no new place), got %v", errs[0])
	}
	mustRelease(t, rs[2], key, "w2")
	if errs := refresh(); len(errs) != 0 {
		t.Fatalf("RefreshQueue(nil): expected no results, got %v", errs)
	}
}

// heads reports whether token, queued on s, gets key (free) by a waiting
// Acquire: every place ahead of it is gone.
func heads(t *testing.T, s driver.Store, key, token string) bool {
	t.Helper()
	_, err := s.Acquire(ctxFor(t, 5*time.Second), waitReq(key, token))
	if err != nil && !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Acquire(%q, %q): expected success or ErrNotAcquired, got %v", key, token, err)
	}
	return err == nil
}
