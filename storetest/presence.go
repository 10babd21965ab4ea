package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/driver"
)

// presenceKeeper returns replica s as a driver.PresenceKeeper whose presence
// was just kept for ttl; it skips the test when s has none.
func presenceKeeper(t *testing.T, s fullStore, ttl time.Duration) driver.PresenceKeeper {
	t.Helper()
	pk, ok := s.(driver.PresenceKeeper)
	if !ok {
		t.Skip("store does not implement driver.PresenceKeeper")
	}
	switch err := pk.KeepPresence(ctxFor(t, 5*time.Second), ttl); {
	case errors.Is(err, errors.ErrUnsupported):
		t.Skipf("store keeps no presence for this client: %v", err)
	case err != nil:
		t.Fatalf("KeepPresence: %v", err)
	}
	return pk
}

// waitingOn returns key's live waiters as s.Inspect reports them (the key
// is held).
func waitingOn(t *testing.T, s fullStore, key string) int {
	t.Helper()
	info, err := s.Inspect(ctxFor(t, 5*time.Second), key)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	return info.Waiting
}

// presenceKeeps checks driver.PresenceKeeper: a place queued with Kept
// lives past its QueueTTL while its Store keeps its presence, a release
// hands it the key capped at the presence's end, and once the presence
// lapses the place ends with it, long before Kept.
func (r *runner) presenceKeeps(t *testing.T) {
	const qttl, presence = 200 * time.Millisecond, 400 * time.Millisecond
	rs := r.replicas(t, 2)
	pk := presenceKeeper(t, rs[1], presence)
	key := r.key(t, "k")
	mustAcquire(t, rs[0], key, "h", time.Minute)
	req := driver.AcquireRequest{Key: key, Token: "w", TTL: 10 * time.Second, QueueTTL: qttl, Kept: time.Minute}
	if _, err := rs[1].Acquire(ctxFor(t, 5*time.Second), req); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("waiting Acquire with Kept: expected ErrNotAcquired, got %v", err)
	}
	for range 6 { // three QueueTTLs
		time.Sleep(qttl / 2)
		if err := pk.KeepPresence(ctxFor(t, 5*time.Second), presence); err != nil {
			t.Fatal(err)
		}
	}
	if n := waitingOn(t, rs[0], key); n != 1 {
		t.Fatalf("expected the place kept by the presence past its QueueTTL, got %d waiting", n)
	}
	mustRelease(t, rs[0], key, "h")
	info, err := rs[0].Inspect(ctxFor(t, 5*time.Second), key)
	if err != nil || info.Token != "w" {
		t.Fatalf("expected the release to hand the key to the kept place, got %+v, %v", info, err)
	}
	if info.Remaining > presence+r.h.Slack {
		t.Errorf("expected the grant capped at the presence's end (%v), %v left", presence, info.Remaining)
	}

	mustRelease(t, rs[1], key, "w")
	mustAcquire(t, rs[0], key, "h2", time.Minute)
	if _, err := rs[1].Acquire(ctxFor(t, 5*time.Second), req); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("waiting Acquire with Kept: expected ErrNotAcquired, got %v", err)
	}
	deadline := time.Now().Add(10*time.Second + r.h.Slack)
	for waitingOn(t, rs[0], key) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("expected the kept place gone with the presence (%v), still queued after 10s (Kept %v)", presence, req.Kept)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// presenceHandsFreeKey checks that an Acquire that finds the key free with
// a place kept by a presence at the head hands the key to that head, as a
// release would (the place may be one its process forgot), and wakes it
// with the grant; the caller is refused, next in line behind the grant.
func (r *runner) presenceHandsFreeKey(t *testing.T) {
	rs := r.replicas(t, 3)
	presenceKeeper(t, rs[1], time.Minute)
	key := r.key(t, "k")
	mustAcquire(t, rs[0], key, "h", 300*time.Millisecond)
	n, ok := rs[1].(driver.Notifier)
	if !ok {
		t.Skip("store does not implement driver.Notifier")
	}
	wake, stop, err := n.WaitRelease(ctxFor(t, 5*time.Second), key, "f")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if _, err := rs[1].Acquire(ctxFor(t, 5*time.Second), driver.AcquireRequest{Key: key, Token: "f", TTL: 5 * time.Second, QueueTTL: time.Second, Kept: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("waiting Acquire with Kept: expected ErrNotAcquired, got %v", err)
	}
	time.Sleep(400*time.Millisecond + r.h.Slack) // the holder's lock expires; nobody releases
	g, err := rs[2].Acquire(ctxFor(t, 5*time.Second), waitReq(key, "o"))
	if !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Acquire behind a kept head: expected ErrNotAcquired, got %v", err)
	}
	if info, err := rs[0].Inspect(ctxFor(t, 5*time.Second), key); err != nil || info.Token != "f" {
		t.Fatalf("expected the free key handed to the kept head f, got %+v, %v", info, err)
	}
	if g.Remaining <= 0 || g.Ahead != 0 {
		t.Errorf("expected the acquirer next in line, timing the grant's TTL, got %+v", g)
	}
	timeout := time.After(5*time.Second + r.h.Slack)
	for {
		select {
		case w := <-wake:
			if w.Fence == 0 {
				continue // a store may wake a new subscriber at once
			}
			return
		case <-timeout:
			t.Fatal("expected the grant sent to the kept head's process within 5s")
		}
	}
}
