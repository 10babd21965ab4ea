package storetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
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
	// Many places in one call (a store may split it): each gets its answer.
	many := []driver.QueueRefresh{{Key: key, Token: "w", QueueTTL: short}}
	for i := range 300 {
		many = append(many, driver.QueueRefresh{Key: r.key(t, "many"+strconv.Itoa(i)), Token: "w", QueueTTL: short})
	}
	for i, err := range refresh(many...) {
		if want := error(driver.ErrNotQueued); i == 0 && err != nil || i > 0 && !errors.Is(err, want) {
			t.Fatalf("RefreshQueue of 301 places, one queued: place %d: expected %v, got %v", i, map[bool]error{true: nil, false: want}[i == 0], err)
		}
	}
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

	// The holder's lock expires (a store may delete it up to Slack late):
	// the refresh says so and grants nothing.
	time.Sleep(time.Until(expired))
	for late := time.Now().Add(r.h.Slack); ; time.Sleep(short / 4) {
		err := refresh(driver.QueueRefresh{Key: key, Token: "w", QueueTTL: short})[0]
		if errors.Is(err, driver.ErrNotHeld) {
			break
		}
		if err != nil || time.Now().After(late) {
			t.Fatalf("RefreshQueue of the head of a free key: expected ErrNotHeld, got %v", err)
		}
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

// tripStore counts one replica's store calls, each one round trip, and
// forwards what a waiting Locker uses (Notifier, QueueRefresher; and
// PresenceKeeper as tripPresent). Once killed, every call fails as on a
// process that lost the store for good.
type tripStore struct {
	fullStore
	n      driver.Notifier
	rq     driver.QueueRefresher
	calls  atomic.Int64
	places atomic.Int64 // places sent in RefreshQueue calls
	acqs   atomic.Int64
	subs   atomic.Int64 // WaitRelease subscriptions made
	kept   atomic.Int64 // KeepPresence calls
	killed atomic.Bool
}

// tripPresent is a tripStore over a driver.PresenceKeeper.
type tripPresent struct {
	*tripStore
	pk driver.PresenceKeeper
}

func (c tripPresent) KeepPresence(ctx context.Context, ttl time.Duration) error {
	c.calls.Add(1)
	c.kept.Add(1)
	if c.killed.Load() {
		return errKilled
	}
	return c.pk.KeepPresence(ctx, ttl)
}

var errKilled = fmt.Errorf("%w: storetest: the process is gone", driver.ErrUnavailable)

func (c *tripStore) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	c.calls.Add(1)
	c.acqs.Add(1)
	if c.killed.Load() {
		return driver.Grant{}, errKilled
	}
	return c.fullStore.Acquire(ctx, req)
}

func (c *tripStore) Renew(ctx context.Context, key, token string, ttl time.Duration) error {
	c.calls.Add(1)
	if c.killed.Load() {
		return errKilled
	}
	return c.fullStore.Renew(ctx, key, token, ttl)
}

func (c *tripStore) Release(ctx context.Context, key, token string) error {
	c.calls.Add(1)
	if c.killed.Load() {
		return errKilled
	}
	return c.fullStore.Release(ctx, key, token)
}

func (c *tripStore) RefreshQueue(ctx context.Context, reqs []driver.QueueRefresh) []error {
	c.calls.Add(1)
	c.places.Add(int64(len(reqs)))
	if c.killed.Load() {
		errs := make([]error, len(reqs))
		for i := range errs {
			errs[i] = errKilled
		}
		return errs
	}
	return c.rq.RefreshQueue(ctx, reqs)
}

func (c *tripStore) WaitRelease(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	ch, stop, err := c.n.WaitRelease(ctx, key, token)
	if err == nil {
		c.subs.Add(1)
	}
	return ch, stop, err
}

// tripLocker returns a Locker over a tripStore of s, with the default
// waiter TTL; it skips the test when s cannot notify or refresh places.
func tripLocker(t *testing.T, s fullStore) (*leasehold.Locker, *tripStore) {
	t.Helper()
	n, ok1 := s.(driver.Notifier)
	rq, ok2 := s.(driver.QueueRefresher)
	if !ok1 || !ok2 {
		t.Skip("store does not implement driver.Notifier and driver.QueueRefresher")
	}
	ts := &tripStore{fullStore: s, n: n, rq: rq}
	var store driver.Store = ts
	if pk, ok := s.(driver.PresenceKeeper); ok {
		store = tripPresent{ts, pk}
	}
	lk, err := leasehold.New(store, leasehold.Options{Name: "storetest", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk.Close() })
	return lk, ts
}

// queueIdleWaiters checks that a Locker's idle waiters keep their places
// with one round trip per refresh interval (WaiterTTL/3) whatever their
// number, for longer than WaiterTTL.
func (r *runner) queueIdleWaiters(t *testing.T) {
	const k = 200
	rs := r.replicas(t, 2)
	lk, ts := tripLocker(t, rs[1])
	every := lk.Options().WaiterTTL / 3
	keys := make([]string, k)
	for i := range keys {
		keys[i] = r.key(t, strconv.Itoa(i))
		mustAcquire(t, rs[0], keys[i], "h", time.Minute)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for _, key := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := lk.Acquire(ctx, key); !errors.Is(err, context.Canceled) {
				t.Errorf("idle waiter of %s: expected to wait until cancelled, got %v", key, err)
			}
		}()
	}
	deadline := time.Now().Add(10*time.Second + r.h.Slack)
	for ts.subs.Load() < k {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters did not queue and subscribe within 10s: %d acquires, %d subscriptions", k, ts.acqs.Load(), ts.subs.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A store may wake a new subscriber at once, for an acquire again:
	// the waiters are idle once their acquires stop.
	for n := int64(-1); n != ts.acqs.Load(); time.Sleep(every / 2) {
		n = ts.acqs.Load()
	}
	// Over a PresenceKeeper, the first refresh of each place moves it to
	// the presence, a round after the presence was first kept.
	time.Sleep(2 * every)
	window := lk.Options().WaiterTTL + every
	calls0, places0, kept0 := ts.calls.Load(), ts.places.Load(), ts.kept.Load()
	time.Sleep(window)
	calls, places, kept := ts.calls.Load()-calls0, ts.places.Load()-places0, ts.kept.Load()-kept0
	rounds := int64(window / every)
	switch {
	case kept > 0: // a store that cannot keep a presence (a Redis Cluster) says so once
		// Each waiter is next in line behind its holder and times the
		// holder's expiry: the presence alone keeps its place, each round.
		if calls > rounds+1 || kept < rounds-1 {
			t.Errorf("%d idle waiters over %v: expected a presence call per refresh interval %v and nothing else, got %d calls, %d of them presence", k, window, every, calls, kept)
		}
		if places >= k {
			t.Errorf("%d idle waiters kept by the presence over %v: expected fewer than one refresh per place, got %d places refreshed", k, window, places)
		}
	default:
		if calls > rounds+1 {
			t.Errorf("%d idle waiters over %v: expected at most %d store calls (one per refresh interval %v), got %d", k, window, rounds+1, every, calls)
		}
		if least := k * (rounds - 1); places < least {
			t.Errorf("%d idle waiters over %v: expected at least %d places refreshed, got %d", k, window, least, places)
		}
	}
	for _, key := range keys {
		if info, err := rs[0].Inspect(ctxFor(t, 5*time.Second), key); err != nil || info.Waiting != 1 {
			t.Fatalf("idle waiter of %s after %v (WaiterTTL %v): expected it still queued, got %+v, %v", key, window, lk.Options().WaiterTTL, info, err)
		}
	}
}

// queueKilledWaiter checks that a waiter whose process dies (its Locker is
// never closed and reaches the store no more) leaves the queue by the
// store's expiry, within WaiterTTL, so that the waiter behind it gets the
// key.
func (r *runner) queueKilledWaiter(t *testing.T) {
	rs := r.replicas(t, 3)
	dead, ds := tripLocker(t, rs[1])
	live, _ := tripLocker(t, rs[2])
	key := r.key(t, "k")
	mustAcquire(t, rs[0], key, "h", time.Minute)
	ctx := ctxFor(t, 30*time.Second)
	queued := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10*time.Second + r.h.Slack)
		for {
			if info, err := rs[0].Inspect(ctx, key); err == nil && info.Waiting == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("expected %d waiters queued within 10s", n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	type result struct {
		ls  *leasehold.Lease
		err error
	}
	deadRes, liveRes := make(chan result, 1), make(chan error, 1)
	go func() { ls, err := dead.Acquire(ctx, key); deadRes <- result{ls, err} }()
	queued(1)
	var got time.Time
	go func() {
		ls, err := live.Acquire(ctx, key)
		got = time.Now()
		if err == nil {
			err = ls.Release(ctx)
		}
		liveRes <- err
	}()
	queued(2)
	time.Sleep(dead.Options().WaiterTTL / 2) // a refresh or two
	ds.killed.Store(true)
	killed := time.Now()
	mustRelease(t, rs[0], key, "h")
	if err := <-liveRes; err != nil {
		t.Fatalf("the waiter behind a killed one: expected the key, got %v", err)
	}
	o := live.Options()
	if bound := o.WaiterTTL + o.WaiterTTL/3 + 500*time.Millisecond + r.h.Slack; got.Sub(killed) > bound {
		t.Errorf("the waiter behind a killed one got the key %v after the kill: expected within %v (WaiterTTL %v, then one refresh)", got.Sub(killed), bound, o.WaiterTTL)
	}
	// The killed waiter's calls fail, but its wake-ups still arrive: a
	// release may have granted it the key (its place was still live), and
	// a Locker takes a grant without a request. Such a lease must end by
	// its own guard before the waiter behind it got the key.
	if r := <-deadRes; r.err == nil && r.ls.ValidUntil().After(got) {
		t.Errorf("the killed waiter's lease was trusted until %v, after the waiter behind it got the key (%v)", r.ls.ValidUntil(), got)
	}
}
