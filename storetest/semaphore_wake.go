package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
)

// permitWaiter is one subscribed permit waiter and its wake-up count.
type permitWaiter struct {
	*counted
	s   leasehold.Semaphorer
	req leasehold.PermitRequest
}

// subscribePermit subscribes token's wake-ups on its own instance, then
// queues it (the order a Locker uses) and checks its place.
func (r *semRunner) subscribePermit(t *testing.T, key, token string, limit, ahead int) *permitWaiter {
	t.Helper()
	s := r.h.New(t)
	n, ok := s.(leasehold.PermitNotifier)
	if !ok {
		t.Skip("store does not implement leasehold.PermitNotifier")
	}
	ch, stop, err := n.WaitPermit(ctxFor(t, 5*time.Second), key, token)
	if err != nil {
		t.Fatalf("WaitPermit(%q, %q): %v", key, token, err)
	}
	c := &counted{name: token, got: make(chan struct{}, 100)}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ch:
				c.wakes.Add(1)
				c.got <- struct{}{}
			case <-done:
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(done)
		wg.Wait()
		stop()
	})
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
	release := func(s leasehold.Semaphorer, tok string) func() {
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
