package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
)

// record is the shared critical-section log of every replica: it counts
// holders (must never exceed one) and checks that fences only grow.
type record struct {
	mu        sync.Mutex
	holders   int
	lastFence uint64
	entries   int
	after     int // entries after the new leader was elected
	afterAt   time.Time
	overlaps  []string
	backwards []string
	causes    map[string]int
	errs      map[string]int
}

func (r *record) enter(replica int, fence uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holders++
	if r.holders > 1 {
		r.overlaps = append(r.overlaps, fmt.Sprintf("replica %d entered with fence %d while %d others held the key", replica, fence, r.holders-1))
	}
	if fence <= r.lastFence {
		r.backwards = append(r.backwards, fmt.Sprintf("replica %d got fence %d after %d", replica, fence, r.lastFence))
	}
	r.lastFence = max(r.lastFence, fence)
	r.entries++
	if !r.afterAt.IsZero() && time.Now().After(r.afterAt) {
		r.after++
	}
}

func (r *record) exit(cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holders--
	if cause != nil && !errors.Is(cause, leasehold.ErrLeaseReleased) {
		r.causes[cause.Error()]++
	}
}

func (r *record) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case errors.Is(err, leasehold.ErrNotAcquired):
		r.errs["not acquired (waited 3s)"]++
	case errors.Is(err, leasehold.ErrStore):
		r.errs["store error"]++
	default:
		r.errs[err.Error()]++
	}
}

// worker is one replica: it takes the key, works for 50 ms to 1.5 s while
// its lease's context is alive (long holds are renewed), and releases.
func worker(ctx context.Context, id int, lk *leasehold.Locker, key string, rec *record) {
	for ctx.Err() == nil {
		actx, cancel := context.WithTimeout(ctx, 3*time.Second)
		lease, err := lk.Acquire(actx, key)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				rec.fail(err)
				time.Sleep(20 * time.Millisecond) // a sick store fails fast: do not spin
			}
			continue
		}
		rec.enter(id, lease.Fence())
		work := time.NewTimer(50*time.Millisecond + rand.N(1450*time.Millisecond))
		select {
		case <-lease.Context().Done():
		case <-work.C:
		case <-ctx.Done():
		}
		work.Stop()
		rec.exit(lease.Err()) // leave before releasing: the key is free after Release
		_ = lease.Release(context.WithoutCancel(ctx))
	}
}

// TestLeaderFailover runs three replicas, each with its own client and
// Locker, contending for one key on a three-member cluster, and kills the
// raft leader mid-run. The cluster elects a new leader; leases that spanned
// the election are either kept (renewed through the new leader) or ended by
// the Fence policy; at no time do two replicas hold the key, fences only grow,
// and work goes on under the new leader.
func TestLeaderFailover(t *testing.T) {
	c := testetcd.StartCluster(t, 3)
	rec := &record{causes: map[string]int{}, errs: map[string]int{}}
	key := uniqueKey(t, "job")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range 3 {
		s := newStore(t, c)
		lk, err := leasehold.New(s, leasehold.Options{
			Name: fmt.Sprintf("replica%d", i), TTL: 3 * time.Second,
			RenewInterval: time.Second, RenewTimeout: time.Second, WaitCap: 500 * time.Millisecond,
			Logger: quiet,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lk.Close() })
		wg.Go(func() { worker(ctx, i, lk, key, rec) })
	}

	time.Sleep(3 * time.Second)
	leader := c.Leader(5 * time.Second)
	killed := time.Now()
	c.Kill(leader)
	next := c.Leader(10 * time.Second)
	elected := time.Now()
	rec.mu.Lock()
	rec.afterAt = elected
	before := rec.entries
	rec.mu.Unlock()
	t.Logf("killed leader m%d; m%d elected after %v; %d acquisitions before", leader, next, elected.Sub(killed).Round(time.Millisecond), before)
	time.Sleep(5 * time.Second)
	cancel()
	wg.Wait()

	rec.mu.Lock()
	defer rec.mu.Unlock()
	t.Logf("acquisitions: %d (%d after the election); lease ends other than release: %v; acquire failures: %v",
		rec.entries, rec.after, rec.causes, rec.errs)
	if len(rec.overlaps) > 0 {
		t.Errorf("two holders at once: %v", rec.overlaps)
	}
	if len(rec.backwards) > 0 {
		t.Errorf("fences went backward: %v", rec.backwards)
	}
	if before == 0 {
		t.Errorf("expected acquisitions before the leader was killed, got none")
	}
	if rec.after == 0 {
		t.Errorf("expected acquisitions after the new leader was elected, got none")
	}
	for cause := range rec.causes {
		if cause != leasehold.ErrLeaseAbandoned.Error() && cause != leasehold.ErrLeaseExpired.Error() && cause != leasehold.ErrLeaseLost.Error() {
			t.Errorf("unexpected lease end: %s", cause)
		}
	}
}

// TestHeldLeaseAcrossLeaderKill holds one lease while the leader dies: the
// holder either keeps it (renewals reach the new leader in time) or learns it
// is over through its context; if it kept it, no one else could take it, and
// once released, another replica gets a greater fence.
func TestHeldLeaseAcrossLeaderKill(t *testing.T) {
	c := testetcd.StartCluster(t, 3)
	ctx := ctxFor(t, 30*time.Second)
	key := uniqueKey(t, "held")
	opts := leasehold.Options{TTL: 3 * time.Second, RenewInterval: time.Second, RenewTimeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	a, err := leasehold.New(newStore(t, c), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	b, err := leasehold.New(newStore(t, c), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })

	la, err := a.TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	c.Kill(c.Leader(5 * time.Second))
	c.Leader(10 * time.Second)
	time.Sleep(4 * time.Second) // longer than the TTL: only renewals keep it

	lb, err := b.TryAcquire(ctx, key)
	switch {
	case la.Err() == nil && err == nil:
		t.Fatalf("a still holds fence %d and b acquired fence %d", la.Fence(), lb.Fence())
	case la.Err() == nil:
		if !errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("b while a holds: expected ErrNotAcquired, got %v", err)
		}
		t.Logf("a kept its lease through the election")
		if err := la.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if lb, err = b.TryAcquire(ctx, key); err != nil {
			t.Fatalf("b after a released: %v", err)
		}
	default:
		t.Logf("a's lease ended: %v", la.Err())
		if err != nil {
			// a gave up first; the key expires on the server soon after.
			lb, err = b.Acquire(ctxFor(t, 10*time.Second), key)
			if err != nil {
				t.Fatalf("b after a's lease ended: %v", err)
			}
		}
	}
	if lb.Fence() <= la.Fence() {
		t.Fatalf("expected b's fence > %d, got %d", la.Fence(), lb.Fence())
	}
	_ = lb.Release(ctx)
}
