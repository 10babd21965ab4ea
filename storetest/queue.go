package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
)

// queueTTL is the waiter TTL of waiters that stay alive through a subtest.
const queueTTL = 30 * time.Second

// queue runs the waiter-queue subtests of driver.Store's contract, each
// with separate store instances (Harness.Replica) as separate processes.
func (r *runner) queue(t *testing.T) {
	t.Run("FIFOAcrossReplicas", r.queueFIFO)
	t.Run("DeadWaiterLeaves", r.queueDeadWaiter)
	t.Run("RefreshKeepsPlaces", r.queueRefresh)
	t.Run("IdleWaitersOneRoundTrip", r.queueIdleWaiters)
	t.Run("KilledWaiterLeaves", r.queueKilledWaiter)
	t.Run("PresenceKeepsPlaces", r.presenceKeeps)
	t.Run("PresenceHandsAFreeKeyToAKeptHead", r.presenceHandsFreeKey)
	t.Run("TryAcquireNeverQueues", r.queueTry)
	t.Run("HolderRecorded", r.queueHolder)
	t.Run("ReleaseOutcomes", r.queueReleaseOutcomes)
	t.Run("ReleaseWakesOnlyTheHead", r.queueWakesHead)
	t.Run("ReleaseGrantsTheHead", r.queueGrants)
	t.Run("ReleaseBeforeSubscribeWakes", r.queueReleaseBeforeSubscribe)
	t.Run("LockersWakeOnlyTheHead", r.queueLockersWakeHead)
	t.Run("NotificationDeadlineHolds", r.queueNotifyDeadline)
	t.Run("HungStoreIsNotContention", r.queueHungStore)
}

// replicas returns n separate store instances over the same data.
func (r *runner) replicas(t *testing.T, n int) []fullStore {
	t.Helper()
	first := r.store(t)
	out := []fullStore{first}
	for len(out) < n {
		var s driver.Store
		if r.h.Replica != nil {
			s = r.h.Replica(t, first)
		} else {
			s = r.h.New(t)
		}
		fs, ok := s.(fullStore)
		if !ok {
			t.Fatalf("storetest: replica %T does not implement driver.Inspector", s)
		}
		out = append(out, fs)
	}
	return out
}

func waitReq(key, token string) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Token: token, TTL: time.Minute, Holder: "holder-" + token, QueueTTL: queueTTL}
}

// mustQueue makes a waiting acquire that must be refused with ahead waiters
// ahead of the token.
func mustQueue(t *testing.T, s driver.Store, req driver.AcquireRequest, ahead int) driver.Grant {
	t.Helper()
	g, err := s.Acquire(ctxFor(t, 5*time.Second), req)
	if !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("Acquire(%q, %q, QueueTTL %v): expected ErrNotAcquired with %d ahead, got %v", req.Key, req.Token, req.QueueTTL, ahead, err)
	}
	if g.Ahead != ahead {
		t.Fatalf("Acquire(%q, %q, QueueTTL %v): expected Grant.Ahead %d, got %d (queue order broken)", req.Key, req.Token, req.QueueTTL, ahead, g.Ahead)
	}
	return g
}

func (r *runner) queueFIFO(t *testing.T) {
	const n = 5
	rs := r.replicas(t, n+1)
	key := r.key(t, "k")
	mustAcquire(t, rs[0], key, "h", time.Minute)
	for i := 1; i <= n; i++ { // waiters join in order w1..w5, each on its own replica
		g := mustQueue(t, rs[i], waitReq(key, fmt.Sprintf("w%d", i)), i-1)
		if g.Remaining <= 0 {
			t.Fatalf("waiter w%d on a held key: expected Grant.Remaining > 0, got %v", i, g.Remaining)
		}
	}
	for i := 1; i <= n; i++ { // a refresh keeps each waiter's place
		mustQueue(t, rs[i], waitReq(key, fmt.Sprintf("w%d", i)), i-1)
	}
	info, err := rs[0].Inspect(ctxFor(t, 5*time.Second), key)
	if err != nil || info.Waiting != n || info.NextHolder != "holder-w1" {
		t.Fatalf("Inspect with %d waiters: expected Waiting %d and NextHolder holder-w1, got %+v, %v", n, n, info, err)
	}
	holder := "h"
	granter := false // a release makes the head the holder
	for i := 1; i <= n; i++ {
		mustRelease(t, rs[0], key, holder)
		if i == 1 {
			granter = heldBy(t, rs[0], key, "w1")
		}
		// Everyone behind the head is refused, latest first, although the key
		// is free (or held by the head it was granted to).
		for j := n; j > i; j-- {
			ahead := j - i
			if granter {
				ahead--
			}
			g := mustQueue(t, rs[j], waitReq(key, fmt.Sprintf("w%d", j)), ahead)
			if (g.Remaining != 0) != granter {
				t.Fatalf("waiter w%d behind the head (granter %v): expected Grant.Remaining > 0 only when the head was granted the key, got %v", j, granter, g.Remaining)
			}
		}
		holder = fmt.Sprintf("w%d", i)
		if _, err := rs[i].Acquire(ctxFor(t, 5*time.Second), waitReq(key, holder)); err != nil {
			t.Fatalf("head waiter %s after the release of the key: expected the grant, got %v", holder, err)
		}
	}
	mustRelease(t, rs[0], key, holder)
	if _, err := rs[0].Inspect(ctxFor(t, 5*time.Second), key); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("after every waiter held and released the key: expected ErrNotHeld, got %v", err)
	}
}

func (r *runner) queueDeadWaiter(t *testing.T) {
	rs := r.replicas(t, 3)
	key := r.key(t, "k")
	const deadTTL = time.Second // one second: the coarsest waiter TTL a store may round to
	mustAcquire(t, rs[0], key, "h", time.Minute)
	dead := waitReq(key, "dead")
	dead.QueueTTL = deadTTL
	mustQueue(t, rs[1], dead, 0)
	joined := time.Now()
	mustQueue(t, rs[2], waitReq(key, "live"), 1)
	mustRelease(t, rs[0], key, "h")
	bound := deadTTL + 2*time.Second + r.h.Slack
	for {
		_, err := rs[2].Acquire(ctxFor(t, 5*time.Second), waitReq(key, "live"))
		if err == nil {
			break
		}
		if !errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("live waiter behind a dead one: expected success or ErrNotAcquired, got %v", err)
		}
		if time.Since(joined) > bound {
			t.Fatalf("a dead waiter (queue TTL %v, stopped refreshing) still blocks the free key after %v", deadTTL, bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if el := time.Since(joined); el < deadTTL/2 {
		t.Fatalf("the live waiter overtook a waiter whose queue TTL (%v) had not run out: granted %v after it joined", deadTTL, el)
	}
	mustRelease(t, rs[2], key, "live")
}

func (r *runner) queueTry(t *testing.T) {
	rs := r.replicas(t, 3)
	key := r.key(t, "k")
	ctx := ctxFor(t, 10*time.Second)
	mustAcquire(t, rs[0], key, "h", time.Minute)
	mustQueue(t, rs[1], waitReq(key, "w"), 0)
	try := driver.AcquireRequest{Key: key, Token: "try", TTL: time.Minute}
	mustQueue(t, rs[2], try, 1) // Ahead is the whole queue for a token that did not queue
	if info, err := rs[0].Inspect(ctx, key); err != nil || info.Waiting != 1 {
		t.Fatalf("after a TryAcquire (QueueTTL 0) on a held key: expected 1 waiter (it must not queue), got %+v, %v", info, err)
	}
	mustRelease(t, rs[0], key, "h")
	if heldBy(t, rs[0], key, "w") {
		g := mustQueue(t, rs[2], try, 0) // the release granted the key to the waiter
		if g.Remaining <= 0 || g.Holder != "holder-w" {
			t.Fatalf("TryAcquire after a release that grants: expected the key held by holder-w, got %+v", g)
		}
	} else {
		g := mustQueue(t, rs[2], try, 1) // the key is free, but a live waiter is ahead
		if g.Remaining != 0 {
			t.Fatalf("TryAcquire of a free key with a waiter: expected Grant.Remaining 0, got %v", g.Remaining)
		}
	}
	if _, err := rs[1].Acquire(ctx, waitReq(key, "w")); err != nil {
		t.Fatalf("the waiter after the release (a TryAcquire tried in between): expected the grant, got %v", err)
	}
	mustRelease(t, rs[1], key, "w")
	if _, err := rs[2].Acquire(ctx, try); err != nil {
		t.Fatalf("TryAcquire of a free key with an empty queue: expected the grant, got %v", err)
	}
	mustRelease(t, rs[2], key, "try")
}

func (r *runner) queueHolder(t *testing.T) {
	rs := r.replicas(t, 2)
	key := r.key(t, "k")
	ctx := ctxFor(t, 10*time.Second)
	req := driver.AcquireRequest{Key: key, Token: "a", TTL: time.Minute, Holder: "host-a/41"}
	if _, err := rs[0].Acquire(ctx, req); err != nil {
		t.Fatalf("Acquire with a holder: %v", err)
	}
	g := mustQueue(t, rs[1], driver.AcquireRequest{Key: key, Token: "b", TTL: time.Minute, Holder: "host-b/42", QueueTTL: queueTTL}, 0)
	if g.Holder != "host-a/41" {
		t.Fatalf("contended Acquire: expected Grant.Holder host-a/41, got %q", g.Holder)
	}
	for i, s := range rs {
		info, err := s.Inspect(ctx, key)
		if err != nil || info.Holder != "host-a/41" || info.Waiting != 1 || info.NextHolder != "host-b/42" {
			t.Fatalf("replica %d Inspect: expected Holder host-a/41, Waiting 1, NextHolder host-b/42, got %+v, %v", i, info, err)
		}
		ls, err := s.List(ctx, key)
		if err != nil || len(ls) != 1 || ls[0].Holder != "host-a/41" {
			t.Fatalf("replica %d List: expected one lock with Holder host-a/41, got %+v, %v", i, ls, err)
		}
	}
}

func (r *runner) queueReleaseOutcomes(t *testing.T) {
	rs := r.replicas(t, 2)
	key := r.key(t, "k")
	ctx := ctxFor(t, 10*time.Second)
	if err := rs[0].Release(ctx, key, "never"); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("Release of a key nobody holds: expected ErrNotHeld, got %v", err)
	}
	f := mustAcquire(t, rs[0], key, "owner", time.Minute)
	if err := rs[1].Release(ctx, key, "other"); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("Release of another token's key: expected ErrNotOwned, got %v", err)
	}
	if info, err := rs[1].Inspect(ctx, key); err != nil || info.Token != "owner" || info.Fence != f {
		t.Fatalf("after a Release with a wrong token: expected the owner's lock untouched, got %+v, %v", info, err)
	}
	mustRelease(t, rs[0], key, "owner")
	// A retry of the same release (its first reply lost) finds the key gone.
	if err := rs[1].Release(ctx, key, "owner"); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("retried Release of a released key: expected ErrNotHeld, never ErrNotOwned; got %v", err)
	}
}

// counted is a waiter's subscription with a count of its wake-ups.
type counted struct {
	name   string
	wakes  atomic.Int64
	got    chan struct{}    // one value per wake-up
	grants chan driver.Wake // the hand-offs among them
}

// countWakes counts token's wake-ups on ch until the test ends, then stops
// the subscription. The wake-up a store puts on the channel at once (see
// driver.Notifier) does not count.
func countWakes(t *testing.T, token string, ch <-chan driver.Wake, stop func()) *counted {
	c := &counted{name: token, got: make(chan struct{}, 100), grants: make(chan driver.Wake, 100)}
	select {
	case <-ch:
	default:
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case w := <-ch:
				if w != (driver.Wake{}) {
					c.grants <- w
				}
				c.wakes.Add(1)
				c.got <- struct{}{}
			case <-done:
				return
			}
		}
	})
	t.Cleanup(func() {
		close(done)
		wg.Wait()
		stop()
	})
	return c
}

func (r *runner) subscribe(t *testing.T, n driver.Notifier, key, token string) *counted {
	t.Helper()
	ch, stop, err := n.WaitRelease(ctxFor(t, 5*time.Second), key, token)
	if err != nil {
		t.Fatalf("WaitRelease(%q, %q): %v", key, token, err)
	}
	return countWakes(t, token, ch, stop)
}

// drainAtOnce takes the wake-up a store put on a new subscription's channel
// at once (see driver.Notifier), if any.
func drainAtOnce(ch <-chan driver.Wake) {
	select {
	case <-ch:
	default:
	}
}

// queueReleaseBeforeSubscribe checks the subscription's start: a waiter
// that queued, then subscribed after the key was released, is woken (at
// once, or by a subscription that resumes from its Acquire), so the Locker
// never misses a release between its acquire and its wait.
func (r *runner) queueReleaseBeforeSubscribe(t *testing.T) {
	rs := r.replicas(t, 2)
	n, ok := rs[1].(driver.Notifier)
	if !ok {
		t.Skip("store does not implement driver.Notifier")
	}
	key := r.key(t, "k")
	mustAcquire(t, rs[0], key, "h", time.Minute)
	mustQueue(t, rs[1], waitReq(key, "w"), 0)
	mustRelease(t, rs[0], key, "h")
	ch, stop, err := n.WaitRelease(ctxFor(t, 5*time.Second), key, "w")
	if err != nil {
		t.Fatalf("WaitRelease: %v", err)
	}
	defer stop()
	select {
	case <-ch:
	case <-time.After(5*time.Second + r.h.Slack):
		t.Fatal("a waiter that subscribed after the release it queued for: expected a wake-up, got none within 5s")
	}
	if heldBy(t, rs[0], key, "w") {
		mustRelease(t, rs[1], key, "w")
	} else if _, err := rs[1].Acquire(ctxFor(t, 5*time.Second), waitReq(key, "w")); err != nil {
		t.Fatalf("the woken waiter's Acquire: expected the grant, got %v", err)
	} else {
		mustRelease(t, rs[1], key, "w")
	}
}

// grant returns the hand-off c's wake-up carried; call it after expectWake.
func (c *counted) grant(t *testing.T) driver.Wake {
	t.Helper()
	select {
	case w := <-c.grants:
		return w
	default:
		t.Fatalf("waiter %s was woken without the release's grant (a zero driver.Wake)", c.name)
		return driver.Wake{}
	}
}

// heldBy reports whether token holds key (a release granted it to token).
func heldBy(t *testing.T, s fullStore, key, token string) bool {
	t.Helper()
	info, err := s.Inspect(ctxFor(t, 5*time.Second), key)
	if err != nil && !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	return err == nil && info.Token == token
}

func (r *runner) expectWake(t *testing.T, c *counted, after string) {
	t.Helper()
	select {
	case <-c.got:
	case <-time.After(5*time.Second + r.h.Slack):
		t.Fatalf("%s: the head waiter %s was not woken within 5s", after, c.name)
	}
}

func expectAsleep(t *testing.T, after string, cs ...*counted) {
	t.Helper()
	time.Sleep(300 * time.Millisecond) // a wrong wake-up arrives about as fast as the right one
	for _, c := range cs {
		if n := c.wakes.Load(); n != 0 {
			t.Fatalf("%s: waiter %s, not the head, was woken %d times (a release must wake only the head)", after, c.name, n)
		}
	}
}

func (r *runner) queueWakesHead(t *testing.T) {
	rs := r.replicas(t, 4)
	ns := make([]driver.Notifier, len(rs))
	for i, s := range rs {
		n, ok := s.(driver.Notifier)
		if !ok {
			t.Skip("store does not implement driver.Notifier")
		}
		ns[i] = n
	}
	key := r.key(t, "k")
	ctx := ctxFor(t, 20*time.Second)
	mustAcquire(t, rs[0], key, "h", time.Minute)
	var ws []*counted
	for i := 1; i <= 3; i++ {
		tok := fmt.Sprintf("w%d", i)
		ws = append(ws, r.subscribe(t, ns[i], key, tok)) // subscribe first, then queue
		mustQueue(t, rs[i], waitReq(key, tok), i-1)
	}
	mustRelease(t, rs[0], key, "h")
	r.expectWake(t, ws[0], "release by the holder")
	expectAsleep(t, "release by the holder", ws[1], ws[2])

	// The head leaves without taking the free key: the next one is woken.
	// A release that grants made w1 the holder, so w1 leaves by releasing it.
	granter := heldBy(t, rs[0], key, "w1")
	if err := rs[1].Release(ctx, key, "w1"); !errors.Is(err, leasehold.ErrNotHeld) && (!granter || err != nil) {
		t.Fatalf("head waiter leaving a free key (granter %v): expected ErrNotHeld, or nil after a grant, got %v", granter, err)
	}
	r.expectWake(t, ws[1], "the head left the queue of a free key")
	expectAsleep(t, "the head left the queue of a free key", ws[2])

	if _, err := rs[2].Acquire(ctx, waitReq(key, "w2")); err != nil {
		t.Fatalf("the new head w2: expected the grant, got %v", err)
	}
	mustRelease(t, rs[2], key, "w2")
	r.expectWake(t, ws[2], "release by w2")
	if n := ws[0].wakes.Load(); n != 1 {
		t.Fatalf("waiter w1 (gone from the queue) was woken %d times, expected once", n)
	}
	if _, err := rs[3].Acquire(ctx, waitReq(key, "w3")); err != nil {
		t.Fatalf("the last waiter w3: expected the grant, got %v", err)
	}
	mustRelease(t, rs[3], key, "w3")
}

// queueNotifyDeadline checks that a waiter's own deadline bounds its
// subscription and its acquire when the notification path hangs.
func (r *runner) queueNotifyDeadline(t *testing.T) {
	hang := r.h.HangNotify
	if hang == nil {
		hang = r.h.Freeze
	}
	if hang == nil {
		t.Skip("Harness.HangNotify and Harness.Freeze are nil")
	}
	rs := r.replicas(t, 2)
	n, ok := rs[1].(driver.Notifier)
	if !ok {
		t.Skip("store does not implement driver.Notifier")
	}
	key := r.key(t, "k")
	mustAcquire(t, rs[0], key, "h", time.Minute)
	restore := hang(t, rs[1])
	defer restore()
	const deadline = 300 * time.Millisecond
	bound := deadline + time.Second + r.h.Slack
	for i := range 3 { // every waiter has its own deadline, not the first one's
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		start := time.Now()
		_, stop, err := n.WaitRelease(ctx, key, fmt.Sprintf("w%d", i))
		el := time.Since(start)
		cancel()
		if err == nil {
			stop()
		}
		if el > bound {
			t.Fatalf("WaitRelease %d with a %v deadline on a hung notification path returned after %v (bound %v)", i, deadline, el, bound)
		}
	}
	// An acquire with its own short deadline is not held up by the hang either.
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	start := time.Now()
	_, err := rs[1].Acquire(ctx, waitReq(key, "w"))
	if el := time.Since(start); el > bound {
		t.Fatalf("Acquire with a %v deadline while the notification path hangs returned after %v (bound %v): %v", deadline, el, bound, err)
	}
}

// queueHungStore checks contention versus failure (#12 item 4): a store that
// does not answer before the deadline is a store failure, never contention.
func (r *runner) queueHungStore(t *testing.T) {
	if r.h.Freeze == nil {
		t.Skip("Harness.Freeze is nil")
	}
	s := r.store(t)
	key := r.key(t, "k")
	mustAcquire(t, s, key, "h", time.Minute)
	lk, err := leasehold.New(s, leasehold.Options{Name: "storetest", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	thaw := r.h.Freeze(t, s)
	defer thaw()
	const deadline = 300 * time.Millisecond
	bound := deadline + 2*time.Second + r.h.Slack
	for _, tc := range []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Acquire (held key)", func(ctx context.Context) error {
			_, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "x", TTL: time.Minute})
			return err
		}},
		{"Acquire (held key, waiting)", func(ctx context.Context) error {
			_, err := s.Acquire(ctx, waitReq(key, "y"))
			return err
		}},
		{"Acquire (free key)", func(ctx context.Context) error {
			_, err := s.Acquire(ctx, driver.AcquireRequest{Key: r.key(t, "free"), Token: "x", TTL: time.Minute})
			return err
		}},
		{"Locker.TryAcquire (held key)", func(ctx context.Context) error {
			_, err := lk.TryAcquire(ctx, key)
			if err != nil && !errors.Is(err, leasehold.ErrStore) {
				return fmt.Errorf("expected an error wrapping ErrStore, got %w", err)
			}
			return err
		}},
		{"Locker.Acquire (held key, waiting)", func(ctx context.Context) error {
			_, err := lk.Acquire(ctx, key)
			if err != nil && !errors.Is(err, leasehold.ErrStore) {
				return fmt.Errorf("expected an error wrapping ErrStore, got %w", err)
			}
			return err
		}},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		start := time.Now()
		err := tc.call(ctx)
		el := time.Since(start)
		cancel()
		switch {
		case err == nil:
			t.Errorf("%s on a frozen store: expected a store error, got success", tc.name)
		case errors.Is(err, leasehold.ErrNotAcquired):
			t.Errorf("%s on a frozen store with a %v deadline: expected a store error, got contention: %v", tc.name, deadline, err)
		case el > bound:
			t.Errorf("%s on a frozen store with a %v deadline returned after %v (bound %v)", tc.name, deadline, el, bound)
		}
	}
}

// countingStore counts the Acquire calls one replica's Locker makes.
type countingStore struct {
	fullStore
	n        driver.Notifier
	acquires atomic.Int64
}

func (c *countingStore) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	c.acquires.Add(1)
	return c.fullStore.Acquire(ctx, req)
}

func (c *countingStore) WaitRelease(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	return c.n.WaitRelease(ctx, key, token)
}

// queueLockersWakeHead checks the queue under Lockers, one per replica: a
// release makes only the head's Locker call the store; the others stay
// asleep (no store call) until their turn.
func (r *runner) queueLockersWakeHead(t *testing.T) {
	const n = 3
	rs := r.replicas(t, n+1)
	key := r.key(t, "k")
	ctx := ctxFor(t, 60*time.Second)
	mustAcquire(t, rs[0], key, "h", time.Minute)
	counts, results := r.queueLockers(t, ctx, rs, key, n)
	release := func() { mustRelease(t, rs[0], key, "h") }
	handOffInTurn(t, ctx, r.h.Slack, results, func(j int) int64 { return counts[j].acquires.Load() }, "Acquire", "key", release)
}

// handOffInTurn releases len(results) times, first with releaseFirst, then
// with the Lease the previous head got, and fails unless Locker i gets
// hand-off i within 5 s while no Locker behind it calls the store: calls(j)
// is Locker j's store calls (named call) so far; thing names what they wait
// for.
func handOffInTurn(t *testing.T, ctx context.Context, slack time.Duration, results []chan *leasehold.Lease,
	calls func(j int) int64, call, thing string, releaseFirst func()) {
	t.Helper()
	n := len(results)
	release := releaseFirst
	for i := range n {
		before := settle(n, calls)
		release()
		var l *leasehold.Lease
		select {
		case l = <-results[i]:
		case <-time.After(5*time.Second + slack):
			t.Fatalf("Locker %d, the head, did not get the %s within 5s of the release", i, thing)
		}
		if l == nil {
			t.FailNow()
		}
		time.Sleep(300 * time.Millisecond)
		for j := i + 1; j < n; j++ {
			if d := calls(j) - before[j]; d != 0 {
				t.Fatalf("hand-off %d: Locker %d, not the head, made %d %s calls (a release must wake only the head)", i, j, d, call)
			}
		}
		release = func() {
			if err := l.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
		}
	}
	release()
}

// settle waits until none of n Lockers has called the store for 200 ms (a
// Locker may retry once right after it subscribed) and returns calls(j) of
// each.
func settle(n int, calls func(j int) int64) []int64 {
	snap := func() []int64 {
		out := make([]int64, n)
		for j := range out {
			out[j] = calls(j)
		}
		return out
	}
	last := snap()
	for range 50 {
		time.Sleep(200 * time.Millisecond)
		now := snap()
		if fmt.Sprint(now) == fmt.Sprint(last) {
			return now
		}
		last = now
	}
	return last
}

// queueLockers starts n Lockers, one per replica rs[1..n], blocked in
// Acquire(key) and queued in that order; each result arrives on its channel.
func (r *runner) queueLockers(t *testing.T, ctx context.Context, rs []fullStore, key string, n int) ([]*countingStore, []chan *leasehold.Lease) {
	t.Helper()
	counts := make([]*countingStore, n)
	results := make([]chan *leasehold.Lease, n)
	for i := range n {
		nt, ok := rs[i+1].(driver.Notifier)
		if !ok {
			t.Skip("store does not implement driver.Notifier")
		}
		counts[i] = &countingStore{fullStore: rs[i+1], n: nt}
		// A long waiter TTL and wait cap: no refresh or poll falls in the test's windows.
		lk, err := leasehold.New(counts[i], leasehold.Options{Name: "storetest", TTL: time.Minute, WaiterTTL: 30 * time.Second, WaitCap: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lk.Close() })
		results[i] = make(chan *leasehold.Lease, 1)
		go func() {
			l, err := lk.Acquire(ctx, key)
			if err != nil {
				t.Errorf("Locker %d: Acquire: %v", i, err)
			}
			results[i] <- l
		}()
		deadline := time.Now().Add(10*time.Second + r.h.Slack)
		for { // join the queue in order
			info, err := rs[0].Inspect(ctx, key)
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

// queueGrants checks a hand-off, for a store whose release grants the key to
// the queue head: the head becomes the holder with a fresh fence and its
// wake-up alone carries the grant; a waiter that missed the message finds
// itself the holder on its next Acquire, with the same fence.
func (r *runner) queueGrants(t *testing.T) {
	rs := r.replicas(t, 3)
	n1, ok1 := rs[1].(driver.Notifier)
	n2, ok2 := rs[2].(driver.Notifier)
	if !ok1 || !ok2 {
		t.Skip("store does not implement driver.Notifier")
	}
	key := r.key(t, "k")
	ctx := ctxFor(t, 20*time.Second)
	f0 := mustAcquire(t, rs[0], key, "h", time.Minute)
	w1 := r.subscribe(t, n1, key, "w1")
	w2 := r.subscribe(t, n2, key, "w2")
	mustQueue(t, rs[1], waitReq(key, "w1"), 0)
	mustQueue(t, rs[2], waitReq(key, "w2"), 1)
	mustRelease(t, rs[0], key, "h")
	if !heldBy(t, rs[0], key, "w1") {
		t.Skip("the store's release does not grant the key to the queue head")
	}
	r.expectWake(t, w1, "release that granted the head")
	expectAsleep(t, "release that granted the head", w2)
	h := w1.grant(t)
	if h.Fence <= f0 || h.TTL != time.Minute {
		t.Fatalf("grant to w1: expected a fence > %d and TTL 1m (what w1 asked for), got %+v", f0, h)
	}
	info, err := rs[0].Inspect(ctx, key)
	if err != nil || info.Token != "w1" || info.Holder != "holder-w1" || info.Fence != h.Fence || info.Waiting != 1 {
		t.Fatalf("after the grant: expected w1 (holder-w1) to hold with fence %d and w2 waiting, got %+v, %v", h.Fence, info, err)
	}
	if info.Remaining <= 0 || info.Remaining > queueTTL {
		t.Fatalf("after the grant: expected the remaining TTL capped at w1's queue deadline (%v), got %v", queueTTL, info.Remaining)
	}
	// An Acquire by the granted waiter (one that missed its message does
	// this) returns the grant's fence.
	mustRelease(t, rs[1], key, "w1")
	r.expectWake(t, w2, "release by w1")
	if h2 := w2.grant(t); h2.Fence <= h.Fence {
		t.Fatalf("grant to w2: expected a fence > %d, got %+v", h.Fence, h2)
	} else {
		h = h2
	}
	g, err := rs[2].Acquire(ctx, waitReq(key, "w2"))
	if err != nil || g.Fence != h.Fence {
		t.Fatalf("w2's Acquire after its grant: expected the granted fence %d, got %+v, %v", h.Fence, g, err)
	}
	mustRelease(t, rs[2], key, "w2")
	if _, err := rs[0].Inspect(ctx, key); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("after the last holder released with nobody queued: expected ErrNotHeld, got %v", err)
	}
}
