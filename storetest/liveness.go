package storetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
)

// The liveness run's shape: livenessReplicas stores (each with a Locker per
// round) × livenessWorkers goroutines race for livenessKeys keys for
// livenessRound, again and again until the run's duration is spent.
const (
	livenessReplicas  = 4
	livenessWorkers   = 4
	livenessKeys      = 3
	livenessRoundFor  = time.Second
	livenessFor       = 40 * time.Second // the default duration of RunLiveness
	livenessTTL       = 3 * time.Second  // whole seconds: etcd's lease precision
	livenessWaiterTTL = 3 * time.Second
	livenessLoss      = 0.02 // lost Acquire and Release replies
	livenessCancel    = 0.30 // acquires whose context ends at a random moment
	livenessTry       = 0.10 // TryAcquire instead of Acquire
	livenessClose     = 0.50 // rounds in which one Locker closes mid-round
)

// RunLiveness runs a randomized liveness test against the stores of h for
// d (0 means 40 s): each round, livenessReplicas stores of one server
// (h.Replica, else h.New: separate instances, as separate processes) each
// get a Locker whose goroutines take random keys with Acquire (30 % of them
// cancelled at a random moment) and TryAcquire (10 %), hold them briefly and
// release them, while 2 % of the Acquire and Release replies are lost after
// the store applied the call and, in half of the rounds, one Locker closes
// mid-round. It fails when
//
//   - a key stays free for longer than WaiterTTL while goroutines wait for
//     it (a lost wake-up, a dead entry at the head of the queue, a lock
//     without owner that outlives its TTL), or
//   - once a round's Lockers are closed (so every owner is gone and every
//     clean-up done), a lock or a queue entry outlives its TTL or WaiterTTL.
//
// A lock or entry left without owner that goes by its TTL is logged, and
// fails the run only when more than a quarter of the rounds (and more than
// two) left one: an acquire cancelled in flight can be applied after its
// clean-up release, and the server's expiry is then what ends it. Keys whose lease
// ended without a release in a round (abandoned, lost, expired) are exempt
// from the first check. Both bounds add h.Slack and a second. A failure names
// what happened to the orphan's calls; with LEASEHOLD_LIVENESS_TRACE set, the
// run also logs every call on an orphan's key.
func RunLiveness(t *testing.T, h Harness, d time.Duration) {
	t.Helper()
	if h.New == nil {
		t.Fatal("storetest: Harness.New is nil")
	}
	if d <= 0 {
		d = livenessFor
	}
	r := &runner{h: h, run: fmt.Sprintf("%x", time.Now().UnixNano())}
	stores := r.replicas(t, livenessReplicas)
	seed := uint64(time.Now().UnixNano())
	t.Logf("liveness: seed %d, %d replicas × %d goroutines, %d keys, for %v", seed, livenessReplicas, livenessWorkers, livenessKeys, d)
	lossy := make([]*lossyStore, len(stores))
	for i, s := range stores {
		lossy[i] = newLossy(s, livenessLoss, seed+uint64(i))
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	start := time.Now()
	rounds := 0
	var st liveStats
	for ; time.Since(start) < d && !t.Failed(); rounds++ {
		lr := &liveRound{r: r, t: t, stores: stores, lossy: lossy, rng: rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())), stats: &st}
		lr.run(rounds)
	}
	t.Logf("liveness: %d rounds in %v: %d leases, %d acquires gave up, %d store errors, %d orphans gone by their TTL (in %d rounds)",
		rounds, time.Since(start).Round(time.Millisecond), st.leases.Load(), st.gaveUp.Load(), st.errors.Load(), st.orphans.Load(), st.orphanRounds.Load())
	if n := int(st.orphanRounds.Load()); n > max(2, rounds/4) {
		t.Errorf("liveness: %d of %d rounds left a lock or queue entry without owner (gone by its TTL): more than a quarter; "+
			"an acquire cancelled in flight accounts for a few, not for most", n, rounds)
	}
}

// liveRound is one round of RunLiveness.
type liveRound struct {
	r      *runner
	t      *testing.T
	stores []fullStore
	lossy  []*lossyStore
	rng    *rand.Rand
	keys   []string
	track  *idleTracker
	stats  *liveStats
}

// liveStats counts what a liveness run did, so its log shows it tested
// something.
type liveStats struct {
	leases, gaveUp, errors, orphans, orphanRounds atomic.Int64
}

func (lr *liveRound) run(n int) {
	t := lr.t
	for i := range livenessKeys {
		lr.keys = append(lr.keys, lr.r.key(t, fmt.Sprintf("round%d:key%d", n, i)))
	}
	for _, w := range lr.lossy {
		w.forget()
	}
	lr.track = newIdleTracker(livenessWaiterTTL + time.Second + lr.r.h.Slack)
	lockers := make([]*leasehold.Locker, len(lr.lossy))
	for i, s := range lr.lossy {
		lk, err := leasehold.New(s.withRefresher(), leasehold.Options{
			Name: "liveness", TTL: livenessTTL, WaiterTTL: livenessWaiterTTL,
			Logger: slog.New(slog.DiscardHandler), Observer: lr.track,
		})
		if err != nil {
			t.Fatal(err)
		}
		lockers[i] = lk
	}
	ctx, cancel := context.WithTimeout(t.Context(), livenessRoundFor)
	defer cancel()
	var wg sync.WaitGroup
	for i, lk := range lockers {
		for w := range livenessWorkers {
			rng := rand.New(rand.NewPCG(lr.rng.Uint64(), uint64(i*livenessWorkers+w)))
			wg.Go(func() { lr.worker(ctx, lk, rng) })
		}
	}
	if lr.rng.Float64() < livenessClose { // one Locker closes mid-round
		victim := lockers[lr.rng.IntN(len(lockers))]
		at := time.Duration(lr.rng.Int64N(int64(livenessRoundFor)))
		wg.Go(func() {
			select {
			case <-time.After(at):
			case <-ctx.Done():
			}
			_ = victim.Close()
		})
	}
	wg.Wait()
	for _, lk := range lockers {
		_ = lk.Close()
	}
	for _, v := range lr.track.violations() {
		t.Errorf("round %d: %s", n, v)
	}
	lr.checkNoOrphans(n)
}

// worker takes random keys until ctx ends or its Locker closes.
func (lr *liveRound) worker(ctx context.Context, lk *leasehold.Locker, rng *rand.Rand) {
	for ctx.Err() == nil {
		key := lr.keys[rng.IntN(len(lr.keys))]
		actx, cancel := ctx, context.CancelFunc(func() {})
		if rng.Float64() < livenessCancel {
			actx, cancel = context.WithTimeout(ctx, time.Duration(rng.Int64N(int64(20*time.Millisecond))))
		}
		try := rng.Float64() < livenessTry
		var lease *leasehold.Lease
		var err error
		if try {
			lease, err = lk.TryAcquire(actx, key)
		} else {
			lr.track.change(key, 0, 1)
			lease, err = lk.Acquire(actx, key)
			lr.track.change(key, 0, -1)
		}
		cancel()
		if lease == nil {
			switch {
			case errors.Is(err, leasehold.ErrLockerClosed):
				return
			case errors.Is(err, leasehold.ErrNotAcquired):
				lr.stats.gaveUp.Add(1)
			default:
				lr.stats.errors.Add(1)
				time.Sleep(time.Millisecond) // a store error (a lost reply): do not spin
			}
			continue
		}
		lr.stats.leases.Add(1)
		lr.track.change(key, 1, 0)
		select {
		case <-time.After(time.Duration(rng.Int64N(int64(5 * time.Millisecond)))):
		case <-lease.Done():
		}
		_ = lease.Release(context.WithoutCancel(ctx))
		lr.track.change(key, -1, 0)
	}
}

// checkNoOrphans checks, once every Locker of the round closed, that no
// key of the round stays held or queued beyond its TTL or WaiterTTL: nothing
// of it has an owner any more. It logs how long each orphan lasted.
func (lr *liveRound) checkNoOrphans(n int) {
	t := lr.t
	time.Sleep(100*time.Millisecond + lr.r.h.Slack) // a server's own asynchrony
	bound := max(livenessTTL, livenessWaiterTTL) + time.Second + lr.r.h.Slack
	orphaned := false
	defer func() {
		if orphaned {
			lr.stats.orphanRounds.Add(1)
		}
	}()
	for _, key := range lr.keys {
		found := time.Now()
		first := lr.probe(key)
		if first == "" {
			continue
		}
		last := first
		for last != "" && time.Since(found) < bound {
			time.Sleep(20 * time.Millisecond)
			last = lr.probe(key)
		}
		if last != "" {
			t.Errorf("round %d: %q: %s after every owner was gone, and still %s %v later, beyond its TTL (%v) and WaiterTTL (%v)",
				n, key, first, last, time.Since(found).Round(time.Millisecond), livenessTTL, livenessWaiterTTL)
			continue
		}
		lr.stats.orphans.Add(1)
		orphaned = true
		if os.Getenv("LEASEHOLD_LIVENESS_TRACE") != "" {
			for i, w := range lr.lossy {
				calls := w.calls(key)
				t.Logf("replica %d, last calls on %q:\n%s", i, key, strings.Join(calls[max(0, len(calls)-15):], "\n"))
			}
		}
		t.Logf("round %d: %q: %s after every owner was gone; it went %v later",
			n, key, first, time.Since(found).Round(time.Millisecond))
	}
}

// history describes what happened to the calls of token, in every replica.
func (lr *liveRound) history(token string) string {
	var out []string
	for i, w := range lr.lossy {
		for _, h := range w.history(token) {
			out = append(out, fmt.Sprintf("replica %d: %s", i, h))
		}
	}
	if len(out) == 0 {
		return "none seen"
	}
	return strings.Join(out, "; ")
}

// probe describes what key holds: "" when it is free with no queue.
func (lr *liveRound) probe(key string) string {
	t := lr.t
	s := lr.stores[0]
	ctx := ctxFor(t, 10*time.Second)
	info, err := s.Inspect(ctx, key)
	switch {
	case err == nil:
		return fmt.Sprintf("a lock held by %.8s… (%v left, %d waiting; its calls: %s)", info.Token, info.Remaining.Round(time.Millisecond), info.Waiting, lr.history(info.Token))
	case !errors.Is(err, leasehold.ErrNotHeld):
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	tok := "probe-" + leasehold.NewToken()
	g, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: tok, TTL: time.Second})
	switch {
	case err == nil:
		if err := s.Release(ctx, key, tok); err != nil {
			t.Fatalf("Release(%q) of the probe: %v", key, err)
		}
		return ""
	case errors.Is(err, leasehold.ErrNotAcquired):
		return fmt.Sprintf("a queue of %d on a free key", g.Ahead)
	}
	t.Fatalf("Acquire(%q) of the probe: %v", key, err)
	return ""
}

// idleTracker watches, per key, how many goroutines hold it and how many
// wait for it, and records every stretch during which the key was free
// while some waited that lasted longer than bound. It is the round's
// Lockers' Observer: a lease that ended without a release exempts its key.
type idleTracker struct {
	bound time.Duration

	mu     sync.Mutex
	keys   map[string]*keyWatch
	failed []string
}

type keyWatch struct {
	holders, waiters int
	idleFrom         time.Time // zero unless free with waiters
	exempt           bool
}

func newIdleTracker(bound time.Duration) *idleTracker {
	return &idleTracker{bound: bound, keys: map[string]*keyWatch{}}
}

func (tr *idleTracker) watch(key string) *keyWatch {
	w := tr.keys[key]
	if w == nil {
		w = &keyWatch{}
		tr.keys[key] = w
	}
	return w
}

// change adds dh holders and dw waiters to key.
func (tr *idleTracker) change(key string, dh, dw int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	w := tr.watch(key)
	w.holders += dh
	w.waiters += dw
	idle := w.holders == 0 && w.waiters > 0
	switch now := time.Now(); {
	case idle && w.idleFrom.IsZero():
		w.idleFrom = now
	case !idle && !w.idleFrom.IsZero():
		if d := now.Sub(w.idleFrom); d > tr.bound && !w.exempt {
			tr.failed = append(tr.failed, fmt.Sprintf("%q was free for %v while goroutines waited for it (bound WaiterTTL + 1 s = %v)",
				key, d.Round(time.Millisecond), tr.bound))
		}
		w.idleFrom = time.Time{}
	}
}

// Observe exempts the key of a lease that ended without a release: the
// store may keep it until its TTL.
func (tr *idleTracker) Observe(e leasehold.Event) {
	switch e.Kind {
	case leasehold.EventAbandoned, leasehold.EventLost, leasehold.EventExpired, leasehold.EventMaxHold:
		tr.mu.Lock()
		tr.watch(e.Key).exempt = true
		tr.mu.Unlock()
	}
}

func (tr *idleTracker) violations() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.failed
}
