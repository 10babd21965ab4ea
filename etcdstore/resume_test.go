package etcdstore_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
)

const txnMethod = "/etcdserverpb.KV/Txn"

// A waiting Locker on another store (replica) sends one acquire
// transaction per contended acquisition: the one that queues it; the
// release grants it the key (the wake-up carries the grant). Its
// WaitRelease watch starts at the revision of the queued acquire's answer,
// so it puts no wake-up on the channel at once and the Locker sends no
// second acquire right after subscribing.
func TestWaiterAcquiresOncePerContendedAcquisition(t *testing.T) {
	c := testetcd.Start(t)
	holder := newStore(t, c)
	waiter, n := countingStore(t, c)
	opts := leasehold.Options{Name: "resume", TTL: 2 * time.Second, WaitCap: time.Minute,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	lkH, lkW := newLocker(t, holder, opts), newLocker(t, waiter, opts)
	key := uniqueKey(t, "k")
	held, err := lkH.Acquire(ctxFor(t, 5*time.Second), key)
	if err != nil {
		t.Fatal(err)
	}
	n.take()
	got := make(chan error, 1)
	go func() {
		l, err := lkW.Acquire(ctxFor(t, 30*time.Second), key)
		if err == nil {
			err = l.Release(ctxFor(t, 5*time.Second))
		}
		got <- err
	}()
	// Queued and subscribed: the watch stream is open. With a wake-up at
	// once the Locker's re-check acquire would follow the subscription; give it
	// time to be sent (a late one would only make this test pass).
	waitFor(t, 10*time.Second, func() bool {
		info, err := holder.Inspect(ctxFor(t, 5*time.Second), key)
		return err == nil && info.Waiting == 1 && n.peek(watchMethod) > 0
	})
	time.Sleep(200 * time.Millisecond)
	if err := held.Release(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	// The waiter's own release is one more transaction.
	if txns := n.take()[txnMethod]; txns != 2 {
		t.Fatalf("expected 2 transactions (queued acquire, release), got %d", txns)
	}
}

const watchMethod = "/etcdserverpb.Watch/Watch"

func (c *calls) peek(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[method]
}

func newLocker(t *testing.T, s driver.Store, opts leasehold.Options) *leasehold.Locker {
	t.Helper()
	lk, err := leasehold.New(s, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk.Close() })
	return lk
}

// waitFor polls cond every 5 ms until it holds, failing the test after d.
func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("condition not met within %v", d)
		}
	}
}

// A release hands the key to the head of the queue. A holder that got the
// key by such a grant knows the next head from its watch, so its own
// release is one transaction that grants the key on; the next waiter gets
// a greater fence.
func TestGrantedHolderReleasesInOneTransaction(t *testing.T) {
	c := testetcd.Start(t)
	b, n := countingStore(t, c)
	a, cs := newStore(t, c), newStore(t, c)
	opts := leasehold.Options{Name: "grant", TTL: 2 * time.Second, WaitCap: time.Minute,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	lkA, lkB, lkC := newLocker(t, a, opts), newLocker(t, b, opts), newLocker(t, cs, opts)
	key := uniqueKey(t, "k")
	ctx := ctxFor(t, 30*time.Second)
	held, err := lkA.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   *leasehold.Lease
		err error
	}
	gotB, gotC := make(chan result, 1), make(chan result, 1)
	queued := func(w int) {
		waitFor(t, 10*time.Second, func() bool {
			info, err := a.Inspect(ctx, key)
			return err == nil && info.Waiting == w
		})
	}
	go func() { l, err := lkB.Acquire(ctx, key); gotB <- result{l, err} }()
	queued(1)
	go func() { l, err := lkC.Acquire(ctx, key); gotC <- result{l, err} }()
	queued(2)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rb := <-gotB
	if rb.err != nil {
		t.Fatal(rb.err)
	}
	n.take()
	if err := rb.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if txns := n.take()[txnMethod]; txns != 1 {
		t.Fatalf("release by a granted holder with a waiter behind it: expected 1 transaction, got %d", txns)
	}
	rc := <-gotC
	if rc.err != nil {
		t.Fatal(rc.err)
	}
	if rc.l.Fence() <= rb.l.Fence() || rb.l.Fence() <= held.Fence() {
		t.Fatalf("fences: expected growing, got %d, %d, %d", held.Fence(), rb.l.Fence(), rc.l.Fence())
	}
	if err := rc.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
