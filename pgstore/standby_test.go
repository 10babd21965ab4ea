package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/testpg"
	"github.com/leasehold/leasehold/pgstore"
)

// These tests take the database away while holders renew and waiters wait:
// a streaming standby promoted after the primary crashed, and a primary
// restarted after a crash (every connection dropped mid-transaction). Each
// holder is a worker with its own pool, Store and Locker, like separate
// processes; while it trusts its lease it writes to a fence.Register every
// 5 ms. The checks: per key, fences in grant order only grow and never
// repeat; the register accepts no write older than one it has accepted;
// every lease that ended on its own did so with a cause a holder can act on
// (lost, expired locally, abandoned). Overlaps (two workers trusting one
// key) are measured and logged, not forbidden: with UNLOGGED tables the
// promoted standby and the restarted primary have no lock rows at all.

type pgGrant struct {
	key     string
	worker  int
	fence   uint64
	at, end time.Time
	cause   error // nil: the worker released it
	relErr  error // the worker's release, when it released
}

type pgRun struct {
	reg *fence.Register

	// Guarded by the register's lock (OnWrite).
	newest        map[string]uint64
	staleAccepted int

	mu      sync.Mutex
	grants  []*pgGrant
	acqErrs int
	errs    map[string]int
}

const pgTTL = 3 * time.Second

var pgKeys = []string{"fo:a", "fo:b"}

// startPGWorkers runs two workers per key on dsn until ctx ends; the
// returned function joins them.
func startPGWorkers(ctx context.Context, t *testing.T, dsn string, opts pgstore.Options) (*pgRun, func()) {
	t.Helper()
	r := &pgRun{newest: map[string]uint64{}, errs: map[string]int{}}
	r.reg = fence.NewRegister(fence.RegisterOptions{OnWrite: func(w fence.Record) {
		if w.Accepted && w.Fence < r.newest[w.Key] {
			r.staleAccepted++
		}
		r.newest[w.Key] = max(r.newest[w.Key], w.Fence)
	}})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var wg sync.WaitGroup
	for i, k := range pgKeys {
		for j := range 2 {
			s := open(t, dsn, opts)
			lk, err := leasehold.New(s, leasehold.Options{TTL: pgTTL, Identity: fmt.Sprintf("w%d", i*2+j), Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = lk.Close() })
			wg.Go(func() { r.worker(ctx, lk, k, i*2+j) })
		}
	}
	return r, wg.Wait
}

func (r *pgRun) worker(ctx context.Context, lk *leasehold.Locker, key string, id int) {
	for ctx.Err() == nil {
		ls, err := lk.Acquire(ctx, key)
		if err != nil {
			r.mu.Lock()
			r.acqErrs++ // store failures while the database is away: try again
			r.errs[err.Error()]++
			r.mu.Unlock()
			pause(ctx, 20*time.Millisecond)
			continue
		}
		g := &pgGrant{key: key, worker: id, fence: ls.Fence(), at: time.Now()}
		r.mu.Lock()
		r.grants = append(r.grants, g)
		r.mu.Unlock()
		// Holds from 0.2 to 2.2 s: some span a renewal (TTL/3) and the fault.
		r.hold(ctx, ls, g, 200*time.Millisecond+rand.N(2*time.Second))
	}
}

// hold writes every 5 ms while the lease is trusted, until it ends or d
// has passed (then the worker releases it).
func (r *pgRun) hold(ctx context.Context, ls *leasehold.Lease, g *pgGrant, d time.Duration) {
	done := time.NewTimer(d)
	defer done.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ls.Done():
			r.mu.Lock()
			g.end, g.cause = time.Now(), ls.Err()
			r.mu.Unlock()
			return
		case <-tick.C:
			if ls.Err() == nil {
				_ = fence.Write(ctx, r.reg, ls, g.key, fmt.Appendf(nil, "w%d", g.worker))
			}
			continue
		case <-done.C:
		case <-ctx.Done():
		}
		r.mu.Lock()
		g.end = time.Now()
		r.mu.Unlock()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		err := ls.Release(rctx)
		cancel()
		r.mu.Lock()
		g.relErr = err
		r.mu.Unlock()
		return
	}
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// pgOutcome is what a run measured around the fault at time fault.
type pgOutcome struct {
	outage      time.Duration // fault -> first grant after it
	overlaps    int
	worst       time.Duration // longest time two workers trusted one key
	spanning    int           // leases granted before the fault that were still trusted after it
	survived    int           // ... of which the store accepted the release after the fault (the lock outlived it)
	causes      map[string]int
	rejected    uint64 // writes the register refused as stale
	grants      int
	after       int // grants after the fault
	acquireErrs int
}

// check verifies fences and causes and measures the run.
func (r *pgRun) check(t *testing.T, fault time.Time) pgOutcome {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	o := pgOutcome{causes: map[string]int{}, grants: len(r.grants), acquireErrs: r.acqErrs}
	_, o.rejected = r.reg.Stats()
	if r.staleAccepted > 0 { // the workers have stopped writing
		t.Errorf("the register accepted %d writes older than a write it had already accepted", r.staleAccepted)
	}
	byKey := map[string][]*pgGrant{}
	for _, g := range r.grants {
		byKey[g.key] = append(byKey[g.key], g)
		o.measure(g, fault)
		if g.cause != nil && !errors.Is(g.cause, leasehold.ErrLeaseLost) && !errors.Is(g.cause, leasehold.ErrLeaseExpired) &&
			!errors.Is(g.cause, leasehold.ErrLeaseAbandoned) {
			t.Errorf("key %q worker %d: lease ended with %v, want lost, expired or abandoned", g.key, g.worker, g.cause)
		}
	}
	for k, gs := range byKey {
		slices.SortFunc(gs, func(a, b *pgGrant) int { return a.at.Compare(b.at) })
		for i := 1; i < len(gs); i++ {
			prev, cur := gs[i-1], gs[i]
			if cur.fence <= prev.fence {
				t.Errorf("key %q: fence went backward: %d (worker %d) granted after %d (worker %d)", k, cur.fence, cur.worker, prev.fence, prev.worker)
			}
			if ov := prev.end.Sub(cur.at); ov > 0 {
				o.overlaps++
				o.worst = max(o.worst, ov)
				t.Logf("key %q: worker %d (fence %d) trusted its lease %v after worker %d (fence %d) was granted; it ended with %v",
					k, prev.worker, prev.fence, ov.Round(time.Millisecond), cur.worker, cur.fence, prev.cause)
			}
		}
	}
	if o.after == 0 {
		t.Errorf("no lease was granted after the fault (acquire errors: %v)", r.errs)
	}
	return o
}

func (o *pgOutcome) measure(g *pgGrant, fault time.Time) {
	if g.at.After(fault) {
		o.after++
		if d := g.at.Sub(fault); o.outage == 0 || d < o.outage {
			o.outage = d
		}
	}
	if g.at.Before(fault) && (g.end.IsZero() || g.end.After(fault)) {
		o.spanning++
		if g.cause == nil && g.relErr == nil {
			o.survived++
		}
	}
	if g.cause != nil {
		o.causes[causeName(g.cause)]++
	}
}

func causeName(err error) string {
	switch {
	case errors.Is(err, leasehold.ErrLeaseLost):
		return "lost"
	case errors.Is(err, leasehold.ErrLeaseExpired):
		return "expired locally"
	case errors.Is(err, leasehold.ErrLeaseAbandoned):
		return "abandoned"
	}
	return err.Error()
}

func (o pgOutcome) String() string {
	return fmt.Sprintf("first grant %v after the fault; %d grants (%d after); %d leases spanned the fault (%d released normally after it); lease ends %v; overlaps %d (longest %v); stale writes rejected %d; acquire errors %d",
		o.outage.Round(time.Millisecond), o.grants, o.after, o.spanning, o.survived, o.causes, o.overlaps, o.worst.Round(time.Millisecond), o.rejected, o.acquireErrs)
}

// pgModes are the two table layouts, run side by side on one database.
var pgModes = []pgstore.Options{{Table: "fo_unlogged"}, {Table: "fo_durable", Durable: true}}

// pgFaultRun starts workers on dsn for each of pgModes, lets them run,
// calls fault, lets them run on and checks each mode's run.
func pgFaultRun(t *testing.T, dsn string, fault func()) {
	t.Helper()
	for _, m := range pgModes {
		_ = open(t, dsn, m) // the objects exist before the workers start (and before a base backup)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	runs := make([]*pgRun, len(pgModes))
	var waits []func()
	for i, m := range pgModes {
		r, wait := startPGWorkers(ctx, t, dsn, m)
		runs[i], waits = r, append(waits, wait)
	}
	join := func() {
		for _, w := range waits {
			w()
		}
	}
	defer join()
	time.Sleep(2 * time.Second)
	at := time.Now()
	fault()
	t.Logf("fault done in %v", time.Since(at).Round(time.Millisecond))
	time.Sleep(2*pgTTL + time.Second) // every lease granted before the fault has been renewed or ended by now
	cancel()
	join()
	for i, m := range pgModes {
		t.Logf("durable=%v: %v", m.Durable, runs[i].check(t, at))
	}
}

// failoverDSN names the primary and the standby; target_session_attrs makes
// pgx connect to whichever accepts writes. synchronous_commit=on undoes the
// test server's server-wide off, as in production, so a Durable commit is
// flushed.
func failoverDSN(hosts ...*testpg.Server) string {
	h := ""
	for i, s := range hosts {
		if i > 0 {
			h += ","
		}
		h += fmt.Sprintf("127.0.0.1:%d", s.Port)
	}
	return "postgres://" + testpg.Superuser + "@" + h + "/postgres?sslmode=disable&connect_timeout=1&target_session_attrs=read-write&synchronous_commit=on"
}

// TestStandbyPromotion crashes the primary while workers hold and wait, and
// promotes its streaming standby (pg_basebackup -R). With UNLOGGED tables
// (the default) the standby has no lock rows, so the first acquire after the
// promotion wins at once and the old holders learn at their next renewal
// that their lease is lost; with Options.Durable the rows were streamed and
// leases live on. Both layouts run side by side, each with its own workers.
func TestStandbyPromotion(t *testing.T) {
	primary := testpg.Start(t)
	standby := primary.StartStandby()
	pgFaultRun(t, failoverDSN(primary, standby), func() {
		primary.Crash()
		standby.Promote()
	})
}

// TestPrimaryCrashRestart crashes the primary (pg_ctl stop -m immediate:
// connections drop mid-transaction) and starts it again on the same port.
// Crash recovery empties UNLOGGED tables, so by default every lock is gone;
// with Options.Durable they are replayed from the WAL.
func TestPrimaryCrashRestart(t *testing.T) {
	srv := testpg.Start(t)
	pgFaultRun(t, failoverDSN(srv), func() {
		srv.Crash()
		srv.Restart()
	})
}
