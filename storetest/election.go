package storetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
)

// errCut is what a cut replica's store answers: its process is gone.
var errCut = errors.New("storetest: replica cut off")

// cutStore is a replica that can be cut off from the server at once, like a
// killed or partitioned process: every call fails, its lock stays in the
// store until the TTL runs out. It forwards every optional capability.
type cutStore struct {
	fullStore
	cut atomic.Bool
}

func (c *cutStore) check() error {
	if c.cut.Load() {
		return errCut
	}
	return nil
}

func (c *cutStore) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := c.check(); err != nil {
		return driver.Grant{}, err
	}
	return c.fullStore.Acquire(ctx, req)
}

func (c *cutStore) Renew(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := c.check(); err != nil {
		return err
	}
	return c.fullStore.Renew(ctx, key, token, ttl)
}

func (c *cutStore) Release(ctx context.Context, key, token string) error {
	if err := c.check(); err != nil {
		return err
	}
	return c.fullStore.Release(ctx, key, token)
}

func (c *cutStore) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []error {
	errs := make([]error, len(reqs))
	br, ok := c.fullStore.(driver.BatchRenewer)
	if err := c.check(); err != nil || !ok {
		for i, r := range reqs {
			errs[i] = err
			if err == nil {
				errs[i] = c.fullStore.Renew(ctx, r.Key, r.Token, r.TTL)
			}
		}
		return errs
	}
	return br.RenewBatch(ctx, reqs)
}

func (c *cutStore) Inspect(ctx context.Context, key string) (driver.LockInfo, error) {
	if err := c.check(); err != nil {
		return driver.LockInfo{}, err
	}
	return c.fullStore.Inspect(ctx, key)
}

func (c *cutStore) WaitRelease(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	n, ok := c.fullStore.(driver.Notifier)
	if !ok {
		return nil, nil, errors.New("storetest: store cannot notify")
	}
	if err := c.check(); err != nil {
		return nil, nil, err
	}
	return n.WaitRelease(ctx, key, token)
}

// term is one participant's trusted leadership: from OnStartedLeading to
// the moment its context ended.
type term struct {
	who        string
	fence      uint64
	start, end time.Time
}

// electionRun records the terms of every participant.
type electionRun struct {
	mu     sync.Mutex
	terms  []term
	starts chan term
}

func (er *electionRun) callbacks(who string) leasehold.Callbacks {
	return leasehold.Callbacks{OnStartedLeading: func(ctx context.Context, lease *leasehold.Lease) {
		tm := term{who: who, fence: lease.Fence(), start: time.Now()}
		er.starts <- tm
		<-ctx.Done()
		tm.end = time.Now()
		er.mu.Lock()
		er.terms = append(er.terms, tm)
		er.mu.Unlock()
	}}
}

// election: three candidates on separate replicas and an observer. The
// leader is cut off (a kill: its lock stays until the TTL), then resigns by
// shutting down (fast failover). Leadership never overlaps, fences rise with
// every term, and the observer sees every leader in order.
func (r *runner) election(t *testing.T) {
	ttl := 1500 * time.Millisecond
	reps := r.replicas(t, 4)
	key := r.key(t, "leader")
	er := &electionRun{starts: make(chan term, 16)}
	type part struct {
		cs     *cutStore
		cancel context.CancelFunc
		done   chan error
		once   sync.Once
	}
	stop := func(p *part) { p.once.Do(func() { p.cancel(); <-p.done }) }
	parts := make(map[string]*part)
	newLocker := func(s driver.Store, who string) *leasehold.Locker {
		l, err := leasehold.New(s, leasehold.Options{Name: "election", Identity: who, TTL: ttl,
			DriftMargin: 400 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	// The observer first, so it sees the first leader.
	obsEl, err := leasehold.NewElection(newLocker(reps[3], "observer"), key, leasehold.Callbacks{})
	if err != nil {
		t.Fatal(err)
	}
	octx, ostop := context.WithCancel(t.Context())
	defer ostop()
	seen := obsEl.Observe(octx)
	var observed []leasehold.Leader
	var owg sync.WaitGroup
	owg.Add(1)
	go func() {
		defer owg.Done()
		for ld := range seen {
			if !ld.Vacant() {
				observed = append(observed, ld)
			}
		}
	}()
	for i := range 3 {
		who := fmt.Sprintf("p%d", i)
		cs := &cutStore{fullStore: reps[i]}
		el, err := leasehold.NewElection(newLocker(cs, who), key, er.callbacks(who))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		p := &part{cs: cs, cancel: cancel, done: make(chan error, 1)}
		parts[who] = p
		go func() { p.done <- el.Run(ctx) }()
	}
	defer func() {
		for _, p := range parts {
			stop(p)
		}
	}()
	next := func(what string) term {
		t.Helper()
		select {
		case tm := <-er.starts:
			return tm
		case <-time.After(3*ttl + r.h.Slack):
			t.Fatalf("no new leader within %v %s", 3*ttl+r.h.Slack, what)
		}
		return term{}
	}
	first := next("at the start")

	// Kill the leader: its lock stays in the store until the TTL runs out.
	info, err := reps[3].Inspect(t.Context(), key)
	if err != nil {
		t.Fatalf("Inspect the leader: %v", err)
	}
	expires := time.Now().Add(info.Remaining)
	parts[first.who].cs.cut.Store(true)
	second := next("after the leader was cut off")
	t.Logf("takeover after the killed leader's lock expired: %v (TTL %v)", second.start.Sub(expires), ttl)
	if lag := second.start.Sub(expires); lag > ttl/2+r.h.Slack {
		t.Errorf("expected the next candidate to lead within %v of the lock's expiry, got %v", ttl/2+r.h.Slack, lag)
	}

	// Shut the second leader down: it resigns and the third takes over at once.
	// Each leader leads a while first: an observer looks at the store after
	// each notification, and a term shorter than that look can be missed.
	time.Sleep(ttl / 5)
	stopped := time.Now()
	parts[second.who].cancel()
	third := next("after the leader resigned")
	t.Logf("takeover after a resignation: %v", third.start.Sub(stopped))
	if lag := third.start.Sub(stopped); lag > ttl/2+r.h.Slack {
		t.Errorf("expected the resignation to hand over within %v, got %v", ttl/2+r.h.Slack, lag)
	}
	time.Sleep(ttl / 5) // let the observer see the third leader
	for _, p := range parts {
		stop(p)
	}
	ostop()
	owg.Wait()
	checkTerms(t, er.terms, []term{first, second, third})
	checkObserved(t, observed, []term{first, second, third})
}

// checkTerms: terms never overlap, and fences rise in the order of the terms.
func checkTerms(t *testing.T, terms, order []term) {
	t.Helper()
	sort.Slice(terms, func(i, j int) bool { return terms[i].start.Before(terms[j].start) })
	if len(terms) < len(order) {
		t.Fatalf("expected at least %d ended terms, got %d", len(order), len(terms))
	}
	for i := 1; i < len(terms); i++ {
		prev, cur := terms[i-1], terms[i]
		if cur.start.Before(prev.end) {
			t.Errorf("two leaders trusted at once: %s (fence %d) until %v, %s (fence %d) from %v",
				prev.who, prev.fence, prev.end.Format(time.StampMicro), cur.who, cur.fence, cur.start.Format(time.StampMicro))
		}
		if cur.fence <= prev.fence {
			t.Errorf("expected fences to rise with every term, got %d after %d", cur.fence, prev.fence)
		}
	}
}

// checkObserved: the observer saw every leader, in order.
func checkObserved(t *testing.T, observed []leasehold.Leader, order []term) {
	t.Helper()
	var got, want []string
	for _, ld := range observed {
		got = append(got, fmt.Sprintf("%s/%d", ld.Holder, ld.Fence))
	}
	for _, tm := range order {
		want = append(want, fmt.Sprintf("%s/%d", tm.who, tm.fence))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("expected the observer to see leaders %v in order, got %v", want, got)
	}
}
