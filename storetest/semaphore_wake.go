package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
)

// permitWaiter is one subscribed permit waiter and its wake-up count.
type permitWaiter struct {
	*counted
	s   driver.Semaphorer
	req driver.PermitRequest
}

// subscribePermit subscribes token's wake-ups on its own instance, then
// queues it (the order a Locker uses) and checks its place.
func (r *semRunner) subscribePermit(t *testing.T, key, token string, limit, ahead int) *permitWaiter {
	t.Helper()
	s := r.h.New(t)
	n, ok := s.(driver.PermitNotifier)
	if !ok {
		t.Skip("store does not implement driver.PermitNotifier")
	}
	ch, stop, err := n.WaitPermit(ctxFor(t, 5*time.Second), key, token)
	if err != nil {
		t.Fatalf("WaitPermit(%q, %q): %v", key, token, err)
	}
	c := countWakes(t, token, ch, stop)
	req := permitReq(key, token, time.Minute, limit)
	req.QueueTTL = time.Minute
	if g := mustNotPermit(t, s, req); g.Ahead != ahead {
		t.Fatalf("waiter %s: expected %d ahead, got %d", token, ahead, g.Ahead)
	}
	return &permitWaiter{counted: c, s: s, req: req}
}

// wakeStep runs one step that frees permits and checks who woke: every
// waiter of woken within 5s, and none of asleep (their counts must not move
// in the step, nor in the 300 ms after the last expected wake-up). Waiters
// that already could take a permit may be woken again; they are in neither
// list.
func (r *semRunner) wakeStep(t *testing.T, step string, do func(), woken, asleep []*permitWaiter) {
	t.Helper()
	base := make([]int64, len(asleep))
	for i, w := range asleep {
		base[i] = w.wakes.Load()
	}
	for _, w := range woken {
		for len(w.got) > 0 { // earlier wake-ups do not count for this step
			<-w.got
		}
	}
	do()
	for _, w := range woken {
		select {
		case <-w.got:
		case <-time.After(5*time.Second + r.h.Slack):
			t.Fatalf("%s: waiter %s, whose turn came, was not woken within 5s", step, w.name)
		}
	}
	time.Sleep(300 * time.Millisecond) // a wrong wake-up arrives about as fast as the right one
	for i, w := range asleep {
		if d := w.wakes.Load() - base[i]; d != 0 {
			t.Fatalf("%s: waiter %s, whose turn had not come, was woken %d times (a release must wake only as many heads as permits are free)", step, w.name, d)
		}
	}
}

// wakesOnlyFreeHeads checks that freeing a permit wakes only the waiters
// whose turn came, in FIFO order, as many as permits are free: not every
// waiter of the key. Each waiter runs on its own instance.
func (r *semRunner) wakesOnlyFreeHeads(t *testing.T) {
	const limit = 2
	key := r.key(t, "k")
	holder := r.h.New(t)
	ctx := ctxFor(t, 60*time.Second)
	mustPermit(t, holder, permitReq(key, "h1", time.Minute, limit))
	mustPermit(t, holder, permitReq(key, "h2", time.Minute, limit))
	w := make([]*permitWaiter, 5)
	for i := 1; i <= 4; i++ {
		w[i] = r.subscribePermit(t, key, fmt.Sprintf("w%d", i), limit, i-1)
	}
	release := func(s driver.Semaphorer, tok string) func() {
		return func() { mustReleasePermit(t, s, key, tok) }
	}
	pw := func(ws ...*permitWaiter) []*permitWaiter { return ws }
	r.wakeStep(t, "release of h1 (1 permit free)", release(holder, "h1"), pw(w[1]), pw(w[2], w[3], w[4]))
	r.wakeStep(t, "release of h2 (2 permits free)", release(holder, "h2"), pw(w[2]), pw(w[3], w[4]))
	leave := func() {
		if err := w[1].s.ReleasePermit(ctx, key, "w1"); !errors.Is(err, leasehold.ErrNotHeld) {
			t.Fatalf("head waiter w1 leaving: expected ErrNotHeld, got %v", err)
		}
	}
	r.wakeStep(t, "w1 left the queue with 2 permits free", leave, pw(w[3]), pw(w[4]))
	mustPermit(t, w[2].s, w[2].req)
	mustPermit(t, w[3].s, w[3].req)

	// The limit lowered to 1 by a new waiter: a release leaves the count at
	// the new limit, so it wakes nobody; the holder left is not revoked.
	x := r.subscribePermit(t, key, "x", 1, 1)
	r.wakeStep(t, "release of w2 under a limit lowered to 1 (no permit free)", release(w[2].s, "w2"), nil, pw(w[4], x))
	if err := w[3].s.RenewPermit(ctx, key, "w3", time.Minute); err != nil {
		t.Fatalf("holder w3 after the limit was lowered: RenewPermit: %v", err)
	}
	r.wakeStep(t, "release of w3 (1 permit free under limit 1)", release(w[3].s, "w3"), pw(w[4]), pw(x))
	w[4].req.Limit = 1
	mustPermit(t, w[4].s, w[4].req)
	mustReleasePermit(t, w[4].s, key, "w4")
	mustPermit(t, x.s, x.req)
	mustReleasePermit(t, x.s, key, "x")
}

// countingSem counts the AcquirePermit calls one replica's Locker makes.
type countingSem struct {
	driver.Store
	sem      driver.Semaphorer
	n        driver.PermitNotifier
	acquires atomic.Int64
}

func (c *countingSem) AcquirePermit(ctx context.Context, req driver.PermitRequest) (driver.Grant, error) {
	c.acquires.Add(1)
	return c.sem.AcquirePermit(ctx, req)
}

func (c *countingSem) RenewPermit(ctx context.Context, key, token string, ttl time.Duration) error {
	return c.sem.RenewPermit(ctx, key, token, ttl)
}

func (c *countingSem) ReleasePermit(ctx context.Context, key, token string) error {
	return c.sem.ReleasePermit(ctx, key, token)
}

func (c *countingSem) Permits(ctx context.Context, key string) (driver.PermitInfo, error) {
	return c.sem.Permits(ctx, key)
}

func (c *countingSem) WaitPermit(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	return c.n.WaitPermit(ctx, key, token)
}

// lockersWakeOnlyTheHead checks the queue under Lockers, one per instance,
// waiting with Semaphore.Acquire for a semaphore of one permit: a release
// makes only the head's Locker call the store; the others stay asleep (no
// AcquirePermit) until their turn.
func (r *semRunner) lockersWakeOnlyTheHead(t *testing.T) {
	const n = 3
	key := r.key(t, "k")
	holder := r.h.New(t)
	ctx := ctxFor(t, 60*time.Second)
	mustPermit(t, holder, permitReq(key, "h", time.Minute, 1))
	counts, results := r.permitLockers(t, ctx, holder, key, n)
	release := func() { mustReleasePermit(t, holder, key, "h") }
	handOffInTurn(t, ctx, r.h.Slack, results, func(j int) int64 { return counts[j].acquires.Load() }, "AcquirePermit", "permit", release)
}

// permitLockers starts n Lockers, each on its own instance, blocked in
// Semaphore.Acquire (limit 1) and queued in that order.
func (r *semRunner) permitLockers(t *testing.T, ctx context.Context, probe driver.Semaphorer, key string, n int) ([]*countingSem, []chan *leasehold.Lease) {
	t.Helper()
	counts := make([]*countingSem, n)
	results := make([]chan *leasehold.Lease, n)
	for i := range n {
		s := r.h.New(t)
		st, ok := s.(driver.Store)
		nt, ok2 := s.(driver.PermitNotifier)
		if !ok || !ok2 {
			t.Skip("store does not implement driver.Store and driver.PermitNotifier")
		}
		counts[i] = &countingSem{Store: st, sem: s, n: nt}
		// A long waiter TTL and wait cap: no refresh or poll falls in the test's windows.
		lk, err := leasehold.New(counts[i], leasehold.Options{Name: "storetest", TTL: time.Minute, WaiterTTL: 30 * time.Second, WaitCap: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lk.Close() })
		sem, err := lk.Semaphore(key, 1)
		if err != nil {
			t.Fatal(err)
		}
		results[i] = make(chan *leasehold.Lease, 1)
		go func() {
			l, err := sem.Acquire(ctx)
			if err != nil {
				t.Errorf("Locker %d: Semaphore.Acquire: %v", i, err)
			}
			results[i] <- l
		}()
		deadline := time.Now().Add(10*time.Second + r.h.Slack)
		for { // join the queue in order
			info, err := probe.Permits(ctx, key)
			if err == nil && info.Waiting == i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Locker %d did not join the queue within 10s: %+v, %v", i, info, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return counts, results
}
