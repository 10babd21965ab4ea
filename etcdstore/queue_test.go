package etcdstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/etcdstore"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
)

func acquireQ(t *testing.T, s *etcdstore.Store, key, tok string, queueTTL time.Duration) (driver.Grant, error) {
	t.Helper()
	return s.Acquire(ctxFor(t, 5*time.Second), driver.AcquireRequest{Key: key, Token: tok, TTL: 10 * time.Second, Holder: "holder-" + tok, QueueTTL: queueTTL})
}

func expectWait(t *testing.T, s *etcdstore.Store, key, tok string, queueTTL time.Duration, ahead int) {
	t.Helper()
	g, err := acquireQ(t, s, key, tok, queueTTL)
	if !errors.Is(err, leasehold.ErrNotAcquired) || g.Ahead != ahead {
		t.Fatalf("%s: expected ErrNotAcquired with %d ahead, got %+v, %v", tok, ahead, g, err)
	}
}

// Waiters on separate stores (replicas) get the key in the order they
// queued; a newcomer, waiting or not, never overtakes them.
func TestQueueIsFIFOAcrossStores(t *testing.T) {
	c := testetcd.Start(t)
	h, s1, s2, s3 := newStore(t, c), newStore(t, c), newStore(t, c), newStore(t, c)
	key := uniqueKey(t, "k")
	if _, err := acquireQ(t, h, key, "h", 0); err != nil {
		t.Fatal(err)
	}
	expectWait(t, s1, key, "w1", time.Minute, 0)
	expectWait(t, s2, key, "w2", time.Minute, 1)
	expectWait(t, s3, key, "w3", time.Minute, 2)
	g, err := acquireQ(t, h, key, "try", 0)
	if !errors.Is(err, leasehold.ErrNotAcquired) || g.Ahead != 3 || g.Holder != "holder-h" || g.Remaining <= 0 {
		t.Fatalf("TryAcquire of a held key: expected ErrNotAcquired, 3 ahead, holder-h and a TTL, got %+v, %v", g, err)
	}
	info, err := h.Inspect(ctxFor(t, 5*time.Second), key)
	if err != nil || info.Waiting != 3 || info.NextHolder != "holder-w1" || info.Holder != "holder-h" {
		t.Fatalf("Inspect: expected 3 waiting, next holder-w1, holder-h, got %+v, %v", info, err)
	}
	if err := h.Release(ctxFor(t, 5*time.Second), key, "h"); err != nil {
		t.Fatal(err)
	}
	// The release granted the key to the head of the queue, w1.
	g, err = acquireQ(t, h, key, "try", 0)
	if !errors.Is(err, leasehold.ErrNotAcquired) || g.Ahead != 2 || g.Holder != "holder-w1" || g.Remaining <= 0 {
		t.Fatalf("TryAcquire after a release to waiters: expected ErrNotAcquired, 2 ahead, holder-w1 and a TTL, got %+v, %v", g, err)
	}
	expectWait(t, h, key, "late", time.Minute, 2)
	expectWait(t, s3, key, "w3", time.Minute, 1)
	expectWait(t, s2, key, "w2", time.Minute, 0)
	grantInOrder(t, key, []*etcdstore.Store{s1, s2, s3, h}, []string{"w1", "w2", "w3", "late"})
	if _, err := acquireQ(t, h, key, "try", 0); err != nil {
		t.Fatalf("TryAcquire after the queue drained: %v", err)
	}
}

// grantInOrder has each waiter take and release key in turn, with growing
// fences.
func grantInOrder(t *testing.T, key string, ss []*etcdstore.Store, toks []string) {
	t.Helper()
	var last uint64
	for i, s := range ss {
		g, err := acquireQ(t, s, key, toks[i], time.Minute)
		if err != nil || g.Fence <= last {
			t.Fatalf("waiter %d (%s): expected the key with a fence > %d, got %+v, %v", i, toks[i], last, g, err)
		}
		last = g.Fence
		if err := s.Release(ctxFor(t, 5*time.Second), key, toks[i]); err != nil {
			t.Fatal(err)
		}
	}
}

// A release wakes only the head of the queue; the next waiter wakes when
// the head got the key and released it.
func TestWaitReleaseWakesOnlyTheHead(t *testing.T) {
	c := testetcd.Start(t)
	h, s1, s2 := newStore(t, c), newStore(t, c), newStore(t, c)
	key := uniqueKey(t, "k")
	ctx := ctxFor(t, 20*time.Second)
	if _, err := acquireQ(t, h, key, "h", 0); err != nil {
		t.Fatal(err)
	}
	expectWait(t, s1, key, "w1", time.Minute, 0)
	expectWait(t, s2, key, "w2", time.Minute, 1)
	ch1, stop1, err := s1.WaitRelease(ctx, key, "w1")
	if err != nil {
		t.Fatal(err)
	}
	defer stop1()
	ch2, stop2, err := s2.WaitRelease(ctx, key, "w2")
	if err != nil {
		t.Fatal(err)
	}
	defer stop2()
	quiet := func(ch <-chan driver.Wake, what string) {
		t.Helper()
		select {
		case <-ch:
			t.Fatalf("%s: woken, expected not", what)
		case <-time.After(300 * time.Millisecond):
		}
	}
	woken := func(ch <-chan driver.Wake, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: not woken within 5s", what)
		}
	}
	if err := h.Release(ctx, key, "h"); err != nil {
		t.Fatal(err)
	}
	woken(ch1, "head after the release")
	quiet(ch2, "second waiter after the release")
	if _, err := acquireQ(t, s1, key, "w1", time.Minute); err != nil {
		t.Fatalf("head: %v", err)
	}
	quiet(ch2, "second waiter after the head took the key")
	if err := s1.Release(ctx, key, "w1"); err != nil {
		t.Fatal(err)
	}
	woken(ch2, "second waiter after the head released")
	if _, err := acquireQ(t, s2, key, "w2", time.Minute); err != nil {
		t.Fatalf("second waiter: %v", err)
	}
}

// A waiter that stops refreshing its place leaves the queue at its queue
// TTL; one that gives up (Release) leaves at once and wakes the next.
func TestDeadWaitersLeaveTheQueue(t *testing.T) {
	c := testetcd.Start(t)
	h, s1, s2, s3 := newStore(t, c), newStore(t, c), newStore(t, c), newStore(t, c)
	key := uniqueKey(t, "k")
	ctx := ctxFor(t, 20*time.Second)
	if _, err := acquireQ(t, h, key, "h", 0); err != nil {
		t.Fatal(err)
	}
	expectWait(t, s1, key, "dead", 300*time.Millisecond, 0)
	expectWait(t, s2, key, "quitter", time.Minute, 1)
	expectWait(t, s3, key, "w", time.Minute, 2)
	ch, stop, err := s3.WaitRelease(ctx, key, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := h.Release(ctx, key, "h"); err != nil {
		t.Fatal(err)
	}
	// The release granted the key to the head: "dead" if its entry was
	// still there, else "quitter". Either way the quitter leaves: an
	// answer, whatever it is, and the next grant or the sweep of the dead
	// waiter's grant at its queue TTL wakes w.
	if err := s2.Release(ctx, key, "quitter"); err != nil && !errors.Is(err, leasehold.ErrNotHeld) && !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("a waiter leaving the queue: %v", err)
	}
	start := time.Now()
	select {
	case <-ch:
	case <-time.After(8 * time.Second):
		t.Fatal("the last waiter was not woken within 8s of the dead waiter's queue TTL")
	}
	// Without the store's deadline the dead waiter's entry would live as
	// long as its store keeps the shared lease alive (for ever).
	if el := time.Since(start); el > 4*time.Second {
		t.Fatalf("woken %v after the release, expected about the dead waiter's 300ms queue TTL", el)
	}
	if _, err := acquireQ(t, s3, key, "w", time.Minute); err != nil {
		t.Fatalf("the last waiter: %v", err)
	}
}

// A waiter whose last Acquire answer is older than the cluster's compaction
// subscribes: the watch starts at the current revision (never at a
// compacted one), and the release wakes it.
func TestWaitReleaseAfterCompaction(t *testing.T) {
	c := testetcd.Start(t)
	cli := c.Client(t)
	h, w := newStore(t, c), newStore(t, c)
	key := uniqueKey(t, "k")
	ctx := ctxFor(t, 20*time.Second)
	if _, err := acquireQ(t, h, key, "h", 0); err != nil {
		t.Fatal(err)
	}
	expectWait(t, w, key, "w", time.Minute, 0)
	var rev int64
	for range 5 {
		r, err := cli.Put(ctx, "unrelated", "x")
		if err != nil {
			t.Fatal(err)
		}
		rev = r.Header.Revision
	}
	if _, err := cli.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	ch, stop, err := w.WaitRelease(ctx, key, "w")
	if err != nil {
		t.Fatalf("WaitRelease after compaction: %v", err)
	}
	defer stop()
	if err := h.Release(ctx, key, "h"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("no wake-up within 5s of the release")
	}
}
