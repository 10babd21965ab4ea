package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
)

// The torture subtest's size. Several replicas race for a few keys with
// random stalls between request and reply; the run stops at tortureGrants
// grants or after tortureFor, whichever comes first, but goes on (up to
// tortureMaxFor) until it has tortureMinGrants: a slow machine gets a longer
// run, not a failure for its speed.
const (
	tortureReplicas  = 8
	tortureWorkers   = 2 // goroutines per replica
	tortureKeys      = 4
	tortureGrants    = 2000
	tortureFor       = 4 * time.Second
	tortureMinGrants = 200 // fewer means the run proved nothing
	tortureMaxFor    = 20 * time.Second
	tortureTTL       = 10 * time.Second
)

// errLostReply is what the stalling wrapper returns when it drops the
// store's answer on the floor (the request was applied).
var errLostReply = errors.New("storetest: reply lost (injected)")

// stallStore forwards Acquire and Release to a store with random stalls
// before the request and after the reply, and sometimes loses an Acquire
// reply after the store applied it, as a slow or lossy network would.
type stallStore struct {
	s   driver.Store
	rng *rand.Rand // one per worker goroutine: not shared
}

func (w *stallStore) stall() {
	switch p := w.rng.Float64(); {
	case p < 0.01:
		time.Sleep(5 * time.Millisecond)
	case p < 0.30:
		time.Sleep(time.Duration(w.rng.Int64N(int64(time.Millisecond))))
	}
}

func (w *stallStore) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	w.stall()
	g, err := w.s.Acquire(ctx, req)
	w.stall()
	if w.rng.Float64() < 0.02 {
		return driver.Grant{}, errLostReply
	}
	return g, err
}

func (w *stallStore) Release(ctx context.Context, key, token string) error {
	w.stall()
	err := w.s.Release(ctx, key, token)
	w.stall()
	return err
}

// tortureGrant is one acquisition as its holder saw it. from is when the
// holder received the grant and to when it sent the release: the store held
// the key for this token at least over [from, to] (it granted before its
// reply arrived and released after the request left), so stalls only shrink
// the observed interval. Two observed intervals of one key that overlap
// mean two true holds overlapped.
type tortureGrant struct {
	key, token string
	fence      uint64
	from, to   time.Time
}

type tortureStats struct {
	attempts, contended, lost, grants atomic.Int64
}

// more reports whether a worker goes on: until tortureGrants grants, or
// stopAt once tortureMinGrants are in, or tortureMaxFor after stopAt's start.
func (st *tortureStats) more(stopAt time.Time) bool {
	n, now := st.grants.Load(), time.Now()
	switch {
	case n >= tortureGrants:
		return false
	case now.Before(stopAt):
		return true
	}
	return n < tortureMinGrants && now.Before(stopAt.Add(tortureMaxFor-tortureFor))
}

// torture races tortureReplicas separate store instances (Harness.Replica)
// for a few keys, with random stalls and lost acquire replies, and checks
// the recorded history: per key, no two grants overlap in time, and fences
// strictly increase in grant order (never repeated). With
// Harness.FencesAhead it runs again with the store's fence counters far
// ahead of its clock.
func (r *runner) torture(t *testing.T) {
	t.Run("Clock", func(t *testing.T) { r.tortureRun(t, nil) })
	if r.h.FencesAhead == nil {
		return
	}
	t.Run("FencesAhead", func(t *testing.T) { r.tortureRun(t, r.h.FencesAhead) })
}

func (r *runner) tortureRun(t *testing.T, prepare func(*testing.T, driver.Store, []string)) {
	stores := r.replicas(t, tortureReplicas)
	keys := make([]string, tortureKeys)
	for i := range keys {
		keys[i] = r.key(t, fmt.Sprintf("k%d", i))
	}
	if prepare != nil {
		prepare(t, stores[0], keys)
	}
	var (
		stats   tortureStats
		mu      sync.Mutex
		history []tortureGrant
		wg      sync.WaitGroup
	)
	stopAt := time.Now().Add(tortureFor)
	ctx := ctxFor(t, tortureMaxFor+30*time.Second+r.h.Slack)
	for i := range tortureReplicas * tortureWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(i)))
			w := &tortureWorker{
				s: &stallStore{s: stores[i%tortureReplicas], rng: rng}, rng: rng,
				name: fmt.Sprintf("%s-w%d", r.run, i), keys: keys, stats: &stats,
			}
			got, err := w.loop(ctx, stopAt)
			mu.Lock()
			history = append(history, got...)
			mu.Unlock()
			if err != nil {
				t.Errorf("worker %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d replicas x %d workers, %d keys: %d acquire attempts, %d grants, %d contended, %d replies lost",
		tortureReplicas, tortureWorkers, tortureKeys, stats.attempts.Load(), stats.grants.Load(),
		stats.contended.Load(), stats.lost.Load())
	if n := len(history); n < tortureMinGrants && !t.Failed() {
		t.Errorf("only %d grants in %v: too few to check anything (expected >= %d)", n, tortureMaxFor, tortureMinGrants)
	}
	checkHistory(t, history)
}

type tortureWorker struct {
	s     *stallStore
	rng   *rand.Rand
	name  string
	keys  []string
	stats *tortureStats
}

// loop acquires and releases random keys until stopAt or until the run has
// enough grants, and returns what it held.
func (w *tortureWorker) loop(ctx context.Context, stopAt time.Time) ([]tortureGrant, error) {
	var got []tortureGrant
	for i := 0; w.stats.more(stopAt); i++ {
		key := w.keys[w.rng.IntN(len(w.keys))]
		tok := fmt.Sprintf("%s-%d", w.name, i)
		fence, err := w.acquire(ctx, key, tok)
		if errors.Is(err, leasehold.ErrNotAcquired) {
			w.stats.contended.Add(1)
			time.Sleep(time.Duration(w.rng.Int64N(int64(500 * time.Microsecond))))
			continue
		}
		if err != nil {
			return got, fmt.Errorf("Acquire(%q, %q): expected success or ErrNotAcquired, got %v", key, tok, err)
		}
		g := tortureGrant{key: key, token: tok, fence: fence, from: time.Now()}
		w.stats.grants.Add(1)
		if w.rng.IntN(2) == 0 { // hold for a moment
			time.Sleep(time.Duration(w.rng.Int64N(int64(300 * time.Microsecond))))
		}
		g.to = time.Now()
		got = append(got, g)
		if err := w.s.Release(ctx, key, tok); err != nil {
			return got, fmt.Errorf("Release(%q, %q) by its holder (fence %d): expected success, got %v", key, tok, fence, err)
		}
	}
	return got, nil
}

// acquire tries key once for tok and, when the reply is lost, retries with
// the same token until the store answers (a retry of an applied acquire
// finds its own token and succeeds with the same fence).
func (w *tortureWorker) acquire(ctx context.Context, key, tok string) (uint64, error) {
	for {
		w.stats.attempts.Add(1)
		g, err := w.s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: tok, TTL: tortureTTL})
		switch {
		case errors.Is(err, errLostReply):
			w.stats.lost.Add(1)
			continue
		case err != nil:
			return 0, err
		case g.Fence == 0:
			return 0, errors.New("expected a fence > 0, got 0")
		}
		return g.Fence, nil
	}
}

// checkHistory checks every key's grants: sorted by the time the holder
// received them, no grant starts before an earlier one ended, and fences
// strictly increase (so none repeats).
func checkHistory(t *testing.T, history []tortureGrant) {
	t.Helper()
	byKey := map[string][]tortureGrant{}
	for _, g := range history {
		byKey[g.key] = append(byKey[g.key], g)
	}
	const maxReports = 10
	reports := 0
	report := func(format string, args ...any) {
		if reports++; reports <= maxReports {
			t.Errorf(format, args...)
		}
	}
	for key, gs := range byKey {
		sort.Slice(gs, func(i, j int) bool { return gs[i].from.Before(gs[j].from) })
		seen := map[uint64]string{}
		var holder tortureGrant // the grant that ends last so far
		for i, g := range gs {
			if other, dup := seen[g.fence]; dup {
				report("key %s: fence %d granted twice, to %s and %s", key, g.fence, other, g.token)
			}
			seen[g.fence] = g.token
			if i > 0 {
				if g.from.Before(holder.to) {
					report("key %s: %s (fence %d) was granted %v before %s (fence %d) released it",
						key, g.token, g.fence, holder.to.Sub(g.from), holder.token, holder.fence)
				}
				if prev := gs[i-1]; g.fence <= prev.fence {
					report("key %s: fence went backward or repeated: %s got %d after %s had %d",
						key, g.token, g.fence, prev.token, prev.fence)
				}
			}
			if i == 0 || g.to.After(holder.to) {
				holder = g
			}
		}
	}
	if reports > maxReports {
		t.Errorf("... and %d more violations", reports-maxReports)
	}
}

// OnePerTest wraps newStore into a Harness.New that makes one store per test
// and returns it from every call with that test: for an embedded store (the
// memory store), whose separate instances share nothing, the replicas of a
// test share one instance, as goroutines of one process would.
func OnePerTest(newStore func(t *testing.T) driver.Store) func(t *testing.T) driver.Store {
	var (
		mu sync.Mutex
		m  = map[*testing.T]driver.Store{}
	)
	return func(t *testing.T) driver.Store {
		mu.Lock()
		defer mu.Unlock()
		if s, ok := m[t]; ok {
			return s
		}
		s := newStore(t)
		m[t] = s
		t.Cleanup(func() {
			mu.Lock()
			delete(m, t)
			mu.Unlock()
		})
		return s
	}
}
