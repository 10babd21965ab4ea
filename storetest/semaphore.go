package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
)

// SemaphoreHarness tells RunSemaphore how to get semaphore stores.
type SemaphoreHarness struct {
	// New returns a store over the shared server. Every call must see the
	// same data: the suite uses several instances as separate replicas (an
	// embedded store's harness returns the same instance every time). It
	// should register cleanup with t.Cleanup.
	New func(t *testing.T) driver.Semaphorer

	// Break and Heal are as in Harness; without Break the "store errors"
	// subtest is skipped.
	Break func(t *testing.T, s driver.Semaphorer)
	Heal  func(t *testing.T, s driver.Semaphorer)

	// Slack is added to every timing bound.
	Slack time.Duration

	// MinTTL is the shortest TTL the store honours exactly enough for the
	// expiry subtests (etcd leases count whole seconds). Default 300ms.
	MinTTL time.Duration
}

// RunSemaphore runs the conformance suite of driver.Semaphorer as subtests
// of t, one after the other.
func RunSemaphore(t *testing.T, h SemaphoreHarness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("storetest: SemaphoreHarness.New is nil")
	}
	if h.MinTTL <= 0 {
		h.MinTTL = 300 * time.Millisecond
	}
	r := &semRunner{h: h, run: fmt.Sprintf("%x", time.Now().UnixNano())}
	t.Run("AtMostNUnderPausesAndCrashes", r.atMostN)
	t.Run("FencesUniqueAndIncreasing", r.fences)
	t.Run("TokenChecked", r.tokenChecked)
	t.Run("CrashedPermitReclaimedAfterTTL", r.crashReclaimed)
	t.Run("FIFOGrants", r.fifo)
	t.Run("DeadWaiterLeavesQueue", r.deadWaiter)
	t.Run("LimitLoweredAtRunTime", r.limitLowered)
	t.Run("Notification", r.notification)
	t.Run("ReleaseWakesOnlyFreeHeads", r.wakesOnlyFreeHeads)
	t.Run("LockersWakeOnlyTheHead", r.lockersWakeOnlyTheHead)
	t.Run("StoreErrorsAreNotContention", r.storeErrors)
}

type semRunner struct {
	h   SemaphoreHarness
	run string
}

func (r *semRunner) key(t *testing.T, suffix string) string {
	return fmt.Sprintf("storetest:%s:%s:%s", r.run, strings.ReplaceAll(t.Name(), "/", "."), suffix)
}

func permitReq(key, token string, ttl time.Duration, limit int) driver.PermitRequest {
	return driver.PermitRequest{Key: key, Token: token, TTL: ttl, Limit: limit, Holder: "holder-" + token}
}

func mustPermit(t *testing.T, s driver.Semaphorer, req driver.PermitRequest) uint64 {
	t.Helper()
	g, err := s.AcquirePermit(ctxFor(t, 5*time.Second), req)
	if err != nil {
		t.Fatalf("AcquirePermit(%q, %q, limit %d): expected a permit, got %v", req.Key, req.Token, req.Limit, err)
	}
	if g.Fence == 0 {
		t.Fatalf("AcquirePermit(%q, %q): expected a fence > 0, got 0", req.Key, req.Token)
	}
	return g.Fence
}

func mustNotPermit(t *testing.T, s driver.Semaphorer, req driver.PermitRequest) driver.Grant {
	t.Helper()
	g, err := s.AcquirePermit(ctxFor(t, 5*time.Second), req)
	if !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("AcquirePermit(%q, %q, limit %d): expected ErrNotAcquired, got fence %d err %v", req.Key, req.Token, req.Limit, g.Fence, err)
	}
	return g
}

func mustReleasePermit(t *testing.T, s driver.Semaphorer, key, token string) {
	t.Helper()
	if err := s.ReleasePermit(ctxFor(t, 5*time.Second), key, token); err != nil {
		t.Fatalf("ReleasePermit(%q, %q): expected success, got %v", key, token, err)
	}
}

// trusted is one permit as its holder trusted it: from the acquire reply
// until the release was sent or, for a holder that paused or crashed, until
// its local guard would have fired (acquire sent + TTL).
type trusted struct {
	from, to time.Time
	fence    uint64
	token    string
}

// maxOverlap returns the largest number of intervals that overlap at one
// instant, and one such instant's holders.
func maxOverlap(h []trusted) (int, []string) {
	type ev struct {
		at    time.Time
		delta int
		i     int
	}
	evs := make([]ev, 0, 2*len(h))
	for i, x := range h {
		evs = append(evs, ev{x.from, +1, i}, ev{x.to, -1, i})
	}
	// Ends sort before starts at the same instant: [a, b) intervals.
	sort.Slice(evs, func(i, j int) bool {
		if !evs[i].at.Equal(evs[j].at) {
			return evs[i].at.Before(evs[j].at)
		}
		return evs[i].delta < evs[j].delta
	})
	n, best := 0, 0
	open := map[int]bool{}
	var who []string
	for _, e := range evs {
		n += e.delta
		if e.delta > 0 {
			open[e.i] = true
		} else {
			delete(open, e.i)
		}
		if n > best {
			best, who = n, who[:0]
			for i := range open {
				who = append(who, fmt.Sprintf("%s(fence %d)", h[i].token, h[i].fence))
			}
		}
	}
	return best, who
}

// atMostN runs replicas on separate store instances that take permits, work,
// and sometimes pause past their TTL or crash (never release), and checks
// the recorded history: never more than limit trusted holders at once, every
// fence unique.
func (r *semRunner) atMostN(t *testing.T) {
	const (
		limit    = 3
		replicas = 8
	)
	key := r.key(t, "k")
	ttl := r.h.MinTTL
	run := 2*time.Second + 4*ttl
	var (
		mu      sync.Mutex
		history []trusted
		wg      sync.WaitGroup
	)
	stores := make([]driver.Semaphorer, replicas)
	for i := range stores {
		stores[i] = r.h.New(t)
	}
	end := time.Now().Add(run)
	for i := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[i]
			rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
			for n := 0; time.Now().Before(end); n++ {
				tok := fmt.Sprintf("r%d-%d", i, n)
				sent := time.Now()
				g, err := s.AcquirePermit(ctxFor(t, 5*time.Second), permitReq(key, tok, ttl, limit))
				if err != nil {
					if !errors.Is(err, leasehold.ErrNotAcquired) {
						t.Errorf("replica %d: AcquirePermit: %v", i, err)
						return
					}
					// Back off a random while, longer for stores with coarse
					// TTLs (slower round trips, optimistic retries on etcd).
					time.Sleep(time.Millisecond + time.Duration(rng.Int64N(int64(5*time.Millisecond+ttl/50))))
					continue
				}
				x := holdPermit(t, s, rng, i, key, tok, g.Fence, sent, ttl)
				mu.Lock()
				history = append(history, x)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(history) < 3*limit {
		t.Fatalf("only %d grants in %v: the history proves nothing", len(history), run)
	}
	seen := map[uint64]string{}
	for _, x := range history {
		if prev, dup := seen[x.fence]; dup {
			t.Fatalf("fence %d granted twice: %s and %s", x.fence, prev, x.token)
		}
		seen[x.fence] = x.token
	}
	if n, who := maxOverlap(history); n > limit {
		t.Fatalf("%d trusted holders at once with limit %d: %v", n, limit, who)
	} else if n < 2 {
		t.Fatalf("at most %d holder at once in %d grants: the semaphore never admitted concurrent holders", n, len(history))
	}
	t.Logf("%d grants, at most %d of %d permits trusted at once", len(history), limit, limit)
}

// holdPermit plays one granted permit: a crash (never released), a pause
// past the TTL then a late release, or brief work and a release. It returns
// the interval the holder trusted the permit: from the reply until the
// release was sent, at most until its local guard (acquire sent + TTL).
func holdPermit(t *testing.T, s driver.Semaphorer, rng *rand.Rand, i int, key, tok string, fence uint64, sent time.Time, ttl time.Duration) trusted {
	guard := sent.Add(ttl)
	x := trusted{from: time.Now(), fence: fence, token: tok}
	switch p := rng.IntN(10); {
	case p == 0: // crash: never release, trust ends at the guard
		return trusted{from: x.from, to: guard, fence: fence, token: tok}
	case p == 1: // pause past the TTL, then a late release
		time.Sleep(ttl + ttl/3)
		x.to = guard
	default: // work briefly and release
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
		x.to = time.Now()
		if x.to.After(guard) {
			x.to = guard
		}
	}
	if err := s.ReleasePermit(ctxFor(t, 5*time.Second), key, tok); err != nil && !errors.Is(err, leasehold.ErrNotHeld) {
		t.Errorf("replica %d: ReleasePermit: %v", i, err)
	}
	return x
}

// fences checks that fences are unique and increase across every permit of a
// key, from separate instances, also after expiry.
func (r *semRunner) fences(t *testing.T) {
	a, b := r.h.New(t), r.h.New(t)
	key := r.key(t, "k")
	var last uint64
	check := func(step string, f uint64) {
		t.Helper()
		if f <= last {
			t.Fatalf("%s: expected fence > %d, got %d", step, last, f)
		}
		last = f
	}
	for i := range 12 { // four permits at a time, released in turn
		s := []driver.Semaphorer{a, b}[i%2]
		check(fmt.Sprintf("permit %d", i), mustPermit(t, s, permitReq(key, fmt.Sprintf("t%d", i), time.Minute, 4)))
		if i >= 3 {
			mustReleasePermit(t, []driver.Semaphorer{a, b}[(i-3)%2], key, fmt.Sprintf("t%d", i-3))
		}
	}
	for i := 9; i < 12; i++ {
		mustReleasePermit(t, []driver.Semaphorer{a, b}[i%2], key, fmt.Sprintf("t%d", i))
	}
	check("before expiry", mustPermit(t, a, permitReq(key, "short", r.h.MinTTL, 1)))
	g := r.waitPermit(t, b, permitReq(key, "after-expiry", time.Minute, 1), 5*time.Second+r.h.MinTTL)
	check("after expiry", g.Fence)

	// Concurrent grants: all unique.
	const n = 16
	fences := make(chan uint64, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := []driver.Semaphorer{a, b}[i%2]
			g, err := s.AcquirePermit(ctxFor(t, 10*time.Second), permitReq(key, fmt.Sprintf("c%d", i), time.Minute, n+1))
			if err != nil {
				t.Errorf("concurrent permit %d: %v", i, err)
				return
			}
			fences <- g.Fence
		}()
	}
	wg.Wait()
	close(fences)
	seen := map[uint64]bool{}
	for f := range fences {
		if f <= last || seen[f] {
			t.Fatalf("concurrent permits: fence %d repeats or is not above %d", f, last)
		}
		seen[f] = true
	}
}

// waitPermit retries a try until it is granted or within expires.
func (r *semRunner) waitPermit(t *testing.T, s driver.Semaphorer, req driver.PermitRequest, within time.Duration) driver.Grant {
	t.Helper()
	deadline := time.Now().Add(within + r.h.Slack)
	for {
		g, err := s.AcquirePermit(ctxFor(t, 5*time.Second), req)
		if err == nil {
			return g
		}
		if !errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("AcquirePermit(%q): expected success or ErrNotAcquired, got %v", req.Token, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("AcquirePermit(%q): not granted within %v", req.Token, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *semRunner) tokenChecked(t *testing.T) {
	s := r.h.New(t)
	ctx := ctxFor(t, 10*time.Second)
	key := r.key(t, "k")
	f := mustPermit(t, s, permitReq(key, "a", time.Minute, 2))
	if f2 := mustPermit(t, s, permitReq(key, "a", time.Minute, 2)); f2 != f {
		t.Fatalf("same-token retry: expected fence %d again, got %d", f, f2)
	}
	mustPermit(t, s, permitReq(key, "b", time.Minute, 2))
	checkFull(t, mustNotPermit(t, s, permitReq(key, "c", time.Minute, 2)))
	if err := s.RenewPermit(ctx, key, "c", time.Minute); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("RenewPermit with a token that holds nothing: expected ErrNotOwned, got %v", err)
	}
	if err := s.RenewPermit(ctx, key, "a", time.Minute); err != nil {
		t.Fatalf("RenewPermit: %v", err)
	}
	if err := s.ReleasePermit(ctx, key, "c"); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("ReleasePermit with a token that holds nothing: expected ErrNotHeld, got %v", err)
	}
	checkTwoHolders(t, s, key, f)
	mustReleasePermit(t, s, key, "a")
	if err := s.ReleasePermit(ctx, key, "a"); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("second ReleasePermit: expected ErrNotHeld, got %v", err)
	}
	if err := s.RenewPermit(ctx, key, "a", time.Minute); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("RenewPermit after release: expected ErrNotOwned, got %v", err)
	}
	mustReleasePermit(t, s, key, "b")
	info, err := s.Permits(ctx, key)
	if err != nil || len(info.Holders) != 0 || info.Waiting != 0 {
		t.Fatalf("Permits after every release: expected none, got %+v, %v", info, err)
	}
	if _, err := s.AcquirePermit(ctx, permitReq(key, "z", time.Minute, 0)); err == nil || errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("limit 0: expected a configuration error, got %v", err)
	}
}

// checkFull checks the refusal of a full semaphore held by a and b.
func checkFull(t *testing.T, g driver.Grant) {
	t.Helper()
	if g.Remaining <= 0 || g.Remaining > time.Minute+10*time.Millisecond {
		t.Fatalf("full semaphore: expected Remaining in (0, 1m], got %v", g.Remaining)
	}
	if g.Holder != "holder-a" && g.Holder != "holder-b" {
		t.Fatalf("full semaphore: expected a holder's identity, got %q", g.Holder)
	}
}

// checkTwoHolders checks Permits with holders a (fence f) and b, limit 2.
func checkTwoHolders(t *testing.T, s driver.Semaphorer, key string, f uint64) {
	t.Helper()
	info, err := s.Permits(ctxFor(t, 5*time.Second), key)
	if err != nil {
		t.Fatalf("Permits: %v", err)
	}
	if len(info.Holders) != 2 || info.Holders[0].Token != "a" || info.Holders[1].Token != "b" || info.Limit != 2 {
		t.Fatalf("Permits: expected holders a, b (by fence) and limit 2, got %+v", info)
	}
	if info.Holders[0].Fence != f || info.Holders[0].Holder != "holder-a" || info.Holders[0].Remaining <= 0 {
		t.Fatalf("Permits: holder a: expected fence %d, identity holder-a, remaining > 0, got %+v", f, info.Holders[0])
	}
}

// crashReclaimed: holders that never release; their permits come back at
// their TTL with nothing but the next request on the key.
func (r *semRunner) crashReclaimed(t *testing.T) {
	s, other := r.h.New(t), r.h.New(t)
	key := r.key(t, "k")
	ttl := r.h.MinTTL
	start := time.Now()
	mustPermit(t, s, permitReq(key, "crash1", ttl, 2))
	mustPermit(t, s, permitReq(key, "crash2", ttl, 2))
	g := mustNotPermit(t, other, permitReq(key, "next", time.Minute, 2))
	if g.Remaining <= 0 || g.Remaining > ttl+10*time.Millisecond {
		t.Fatalf("expected Remaining in (0, %v], got %v", ttl, g.Remaining)
	}
	time.Sleep(g.Remaining)
	got := r.waitPermit(t, other, permitReq(key, "next", time.Minute, 2), 2*time.Second)
	if el := time.Since(start); el < ttl {
		t.Fatalf("permit reclaimed after %v, before the crashed holders' TTL %v", el, ttl)
	}
	r.waitPermit(t, other, permitReq(key, "next2", time.Minute, 2), 2*time.Second) // crash2 went a little later
	info, err := other.Permits(ctxFor(t, 5*time.Second), key)
	if err != nil {
		t.Fatalf("Permits: %v", err)
	}
	if len(info.Holders) != 2 || info.Holders[0].Fence != got.Fence {
		t.Fatalf("Permits: expected the two new holders, got %+v", info)
	}
}

// fifo: waiters are granted in the order they queued; newcomers wait behind
// them; widening the limit admits the first waiters.
func (r *semRunner) fifo(t *testing.T) {
	a, b := r.h.New(t), r.h.New(t)
	key := r.key(t, "k")
	qttl := time.Minute
	wait := func(s driver.Semaphorer, tok string, limit int) driver.PermitRequest {
		req := permitReq(key, tok, time.Minute, limit)
		req.QueueTTL = qttl
		return req
	}
	mustPermit(t, a, permitReq(key, "h", time.Minute, 1))
	for i := range 5 {
		s := []driver.Semaphorer{a, b}[i%2]
		g := mustNotPermit(t, s, wait(s, fmt.Sprintf("w%d", i), 1))
		if g.Ahead != i {
			t.Fatalf("waiter w%d: expected %d ahead, got %d", i, i, g.Ahead)
		}
	}
	info, err := b.Permits(ctxFor(t, 5*time.Second), key)
	if err != nil || info.Waiting != 5 || info.NextHolder != "holder-w0" {
		t.Fatalf("Permits: expected 5 waiting, head holder-w0, got %+v, %v", info, err)
	}
	// A refresh keeps the place.
	if g := mustNotPermit(t, a, wait(a, "w2", 1)); g.Ahead != 2 {
		t.Fatalf("w2 refresh: expected 2 ahead, got %d", g.Ahead)
	}
	mustReleasePermit(t, a, key, "h")
	// The permit is free, but only the head may take it.
	if g := mustNotPermit(t, b, permitReq(key, "newcomer", time.Minute, 1)); g.Ahead != 5 || g.Remaining != 0 {
		t.Fatalf("newcomer on a free permit with waiters: expected 5 ahead, Remaining 0, got %+v", g)
	}
	mustNotPermit(t, b, wait(b, "w1", 1))
	mustPermit(t, a, wait(a, "w0", 1))
	// Widened to 3 while w0 holds: the first two waiters (w1, w2) may both
	// take one, in any order; w3 not.
	mustPermit(t, b, wait(b, "w2", 3))
	mustNotPermit(t, b, wait(b, "w3", 3))
	mustPermit(t, a, wait(a, "w1", 3))
	mustNotPermit(t, b, wait(b, "w3", 3))
	mustReleasePermit(t, b, key, "w0")
	g := mustPermit(t, b, wait(b, "w3", 3))
	mustNotPermit(t, a, wait(a, "w4", 3))
	mustReleasePermit(t, a, key, "w1")
	if f := mustPermit(t, a, wait(a, "w4", 3)); f <= g {
		t.Fatalf("w4: expected a fence above w3's %d, got %d", g, f)
	}
	info, err = a.Permits(ctxFor(t, 5*time.Second), key)
	if err != nil || info.Waiting != 0 || len(info.Holders) != 3 {
		t.Fatalf("Permits: expected 3 holders, empty queue, got %+v, %v", info, err)
	}
}

// deadWaiter: a waiter that stops refreshing blocks the queue no longer than
// its queue TTL; a waiter that gives up (ReleasePermit) leaves at once.
func (r *semRunner) deadWaiter(t *testing.T) {
	s := r.h.New(t)
	key := r.key(t, "k")
	qttl := r.h.MinTTL
	mustPermit(t, s, permitReq(key, "h", time.Minute, 1))
	dead := permitReq(key, "dead", time.Minute, 1)
	dead.QueueTTL = qttl
	mustNotPermit(t, s, dead)
	quitter := permitReq(key, "quitter", time.Minute, 1)
	quitter.QueueTTL = time.Minute
	mustNotPermit(t, s, quitter)
	next := permitReq(key, "next", time.Minute, 1)
	next.QueueTTL = time.Minute
	if g := mustNotPermit(t, s, next); g.Ahead != 2 {
		t.Fatalf("next: expected 2 ahead, got %d", g.Ahead)
	}
	if err := s.ReleasePermit(ctxFor(t, 5*time.Second), key, "quitter"); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("a waiter leaving: expected ErrNotHeld (it held no permit), got %v", err)
	}
	mustReleasePermit(t, s, key, "h")
	start := time.Now()
	g := r.waitPermit(t, s, next, qttl+5*time.Second)
	if el := time.Since(start); g.Fence == 0 || el > qttl+2*time.Second+r.h.Slack {
		t.Fatalf("next: granted after %v, expected within the dead waiter's queue TTL %v", el, qttl)
	}
}

// limitLowered: lowering the limit revokes nobody; new permits wait until the
// count is under the new limit.
func (r *semRunner) limitLowered(t *testing.T) {
	a, b := r.h.New(t), r.h.New(t)
	ctx := ctxFor(t, 10*time.Second)
	key := r.key(t, "k")
	for _, tok := range []string{"x", "y", "z"} {
		mustPermit(t, a, permitReq(key, tok, time.Minute, 3))
	}
	mustNotPermit(t, b, permitReq(key, "n", time.Minute, 1))
	for i, tok := range []string{"x", "y"} {
		for _, h := range []string{"x", "y", "z"}[i:] {
			if err := a.RenewPermit(ctx, key, h, time.Minute); err != nil {
				t.Fatalf("holder %s after the limit was lowered: RenewPermit: %v", h, err)
			}
		}
		mustReleasePermit(t, a, key, tok)
		mustNotPermit(t, b, permitReq(key, "n", time.Minute, 1))
	}
	info, err := b.Permits(ctx, key)
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Token != "z" {
		t.Fatalf("Permits: expected holder z, got %+v, %v", info, err)
	}
	mustReleasePermit(t, a, key, "z")
	mustPermit(t, b, permitReq(key, "n", time.Minute, 1))
	if info, err := b.Permits(ctx, key); err != nil || info.Limit != 1 {
		t.Fatalf("Permits: expected limit 1 (the last grant's), got %+v, %v", info, err)
	}
	mustNotPermit(t, a, permitReq(key, "m", time.Minute, 1))
	mustPermit(t, a, permitReq(key, "m", time.Minute, 2)) // raised again
}

func (r *semRunner) notification(t *testing.T) {
	s := r.h.New(t)
	n, ok := s.(driver.PermitNotifier)
	if !ok {
		t.Skip("store does not implement driver.PermitNotifier")
	}
	ctx := ctxFor(t, 20*time.Second)
	key, other := r.key(t, "k"), r.key(t, "other")
	mustPermit(t, s, permitReq(key, "a", time.Minute, 1))
	mustPermit(t, s, permitReq(other, "a", time.Minute, 1))
	ch, stop, err := n.WaitPermit(ctx, key, "w")
	if err != nil {
		t.Fatalf("WaitPermit: %v", err)
	}
	defer stop()
	drainAtOnce(ch)
	mustReleasePermit(t, s, other, "a")
	select {
	case <-ch:
		t.Fatal("a release on another key woke the waiter")
	case <-time.After(200 * time.Millisecond):
	}
	mustReleasePermit(t, r.h.New(t), key, "a") // from another instance
	select {
	case <-ch:
	case <-time.After(5*time.Second + r.h.Slack):
		t.Fatal("no wake-up within 5s of the release")
	}
}

func (r *semRunner) storeErrors(t *testing.T) {
	if r.h.Break == nil {
		t.Skip("harness cannot break the store")
	}
	s := r.h.New(t)
	key := r.key(t, "k")
	r.h.Break(t, s)
	defer func() {
		if r.h.Heal != nil {
			r.h.Heal(t, s)
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second+r.h.Slack)
	defer cancel()
	_, err := s.AcquirePermit(ctx, permitReq(key, "a", time.Minute, 2))
	if err == nil || errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("AcquirePermit on a broken store: expected a store failure, got %v", err)
	}
	if err := s.RenewPermit(ctx, key, "a", time.Minute); err == nil || errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("RenewPermit on a broken store: expected a store failure, got %v", err)
	}
	if err := s.ReleasePermit(ctx, key, "a"); err == nil || errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("ReleasePermit on a broken store: expected a store failure, got %v", err)
	}
}
