package etcdstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/calibrate"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/etcdstore"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
)

// crashable returns a store over a client of its own, and a crash function
// that closes that client under the store: keep-alives, renewals, sweeps
// and the revokes of Close all stop reaching etcd, as when the holder's
// process is killed. The store's lease lives on until etcd expires it.
func crashable(t *testing.T, c *testetcd.Cluster) (*etcdstore.Store, func()) {
	t.Helper()
	cli := c.Client(t)
	s, err := etcdstore.New(cli, testOptions)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, func() { _ = cli.Close() }
}

// warm grants s's leases for 1 s locks and 3 s queue entries (the Locker's
// default WaiterTTL).
func warm(t *testing.T, s *etcdstore.Store, key string) {
	t.Helper()
	ctx := ctxFor(t, 5*time.Second)
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "warm", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	_, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "warm2", TTL: time.Second, QueueTTL: leasehold.DefaultWaiterTTL})
	if !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("warm-up waiter: %v", err)
	}
	for _, tok := range []string{"warm", "warm2"} {
		if err := s.Release(ctx, key, tok); err != nil && !errors.Is(err, leasehold.ErrNotHeld) {
			t.Fatal(err)
		}
	}
}

// The head waiter takes a crashed holder's lock at about the lock's TTL, not
// when etcd expires the holder's shared lease (TTL + 1 s after its last
// keep-alive, checked every 500 ms), and never before the holder's own
// expiry guard stopped trusting the lock.
func TestCrashedHolderTakenOverAtItsTTL(t *testing.T) {
	c := testetcd.Start(t)
	const ttl = time.Second
	drift := calibrate.DriftMargin(ttl)
	for i := range 3 {
		holder, crash := crashable(t, c)
		waiter := newStore(t, c)
		lk := newLocker(t, waiter, leasehold.Options{Name: "waiter", TTL: ttl})
		key := uniqueKey(t, "k")
		ctx := ctxFor(t, 10*time.Second)
		// Both stores have their leases already, as in steady use: the
		// waiter's clock starts at its first answer, which would
		// otherwise come after two lease grants.
		warm(t, holder, key+"-warm")
		warm(t, waiter, key+"-warm")
		sent := time.Now()
		g, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "dead", TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		crash()
		lease, err := lk.Acquire(ctx, key)
		if err != nil {
			t.Fatalf("run %d: the waiter: %v", i, err)
		}
		got := time.Now()
		guardEnd, expiry := sent.Add(ttl-drift), sent.Add(ttl)
		t.Logf("run %d: taken over %v after the holder's TTL", i, got.Sub(expiry))
		if got.Before(guardEnd) {
			t.Fatalf("run %d: taken over %v before the holder's expiry guard ended", i, guardEnd.Sub(got))
		}
		// The shared lease would end at >= TTL + 1 s: anything under
		// TTL + 600 ms is the waiter's takeover.
		if lag := got.Sub(expiry); lag > 600*time.Millisecond {
			t.Fatalf("run %d: taken over %v after the holder's TTL, expected about at it", i, lag)
		}
		if lease.Fence() <= g.Fence {
			t.Fatalf("run %d: fence %d after the crashed holder's %d", i, lease.Fence(), g.Fence)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// The head's retry at its send time + Remaining is the takeover itself: its
// Locker sends one queued acquire and then one takeover transaction, no
// acquire in between that etcd writes and refuses because it came a request
// latency before the takeover was allowed.
func TestHeadTakesOverOnItsFirstRetry(t *testing.T) {
	c := testetcd.Start(t)
	const ttl = time.Second
	for i := range 3 {
		holder, crash := crashable(t, c)
		waiter, n := countingStore(t, c)
		// No refresh of the place (a transaction) before the takeover: the
		// keeper's first round comes after WaiterTTL/3 (and WaitCap), 10 s,
		// far past the takeover also on a loaded machine (at 2 s, a full
		// suite's run once counted it).
		lk := newLocker(t, waiter, leasehold.Options{Name: "waiter", TTL: ttl, WaiterTTL: 30 * ttl, WaitCap: 10 * ttl})
		key := uniqueKey(t, "k")
		ctx := ctxFor(t, 10*time.Second)
		warm(t, holder, key+"-warm")
		warm(t, waiter, key+"-warm")
		if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "dead", TTL: ttl}); err != nil {
			t.Fatal(err)
		}
		crash()
		n.take()
		lease, err := lk.Acquire(ctx, key)
		if err != nil {
			t.Fatalf("run %d: the waiter: %v", i, err)
		}
		if txns := n.take()["/etcdserverpb.KV/Txn"]; txns != 2 {
			t.Fatalf("run %d: expected 2 transactions (the queued acquire and the takeover), got %d", i, txns)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A holder that keeps renewing keeps its lock however long the head waiter
// waits: its renewals, read-only while nobody waits, write the lock while
// someone does (Renew and RenewBatch alike), which restarts the waiter's
// clock.
func TestRenewingHolderIsNotTakenOver(t *testing.T) {
	c := testetcd.Start(t)
	const ttl = time.Second
	holder := newStore(t, c)
	lk, err := leasehold.New(newStore(t, c), leasehold.Options{Name: "waiter", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk.Close() })
	key := uniqueKey(t, "k")
	ctx := ctxFor(t, 20*time.Second)
	if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "alive", TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		wctx := ctxFor(t, 3*ttl)
		l, err := lk.Acquire(wctx, key)
		if err == nil {
			err = errors.New("the waiter got the lock")
			_ = l.Release(ctx)
		}
		waited <- err
	}()
	batch := false
	for {
		select {
		case err := <-waited:
			if !errors.Is(err, leasehold.ErrNotAcquired) {
				t.Fatalf("the waiter, while the holder renewed: expected ErrNotAcquired at its deadline, got %v", err)
			}
			if err := holder.Renew(ctx, key, "alive", ttl); err != nil {
				t.Fatalf("renewal after the waiter gave up: %v", err)
			}
			return
		case <-time.After(ttl / 4):
		}
		var err error
		if batch {
			err = holder.RenewBatch(ctx, []driver.RenewRequest{{Key: key, Token: "alive", TTL: ttl}})[0]
		} else {
			err = holder.Renew(ctx, key, "alive", ttl)
		}
		batch = !batch
		if err != nil {
			t.Fatalf("renewal (batch %v) while a waiter waits: %v", !batch, err)
		}
	}
}

// A waiter that became the head while the lock changed hands (it saw the new
// holder's lock only through its watch, not in an acquire answer) takes a
// crashed holder's lock at that holder's TTL too: the watch records when it
// saw the lock and wakes the head then.
func TestNextWaiterTakesOverFromCrashedHolder(t *testing.T) {
	c := testetcd.Start(t)
	const ttl = time.Second
	drift := calibrate.DriftMargin(ttl)
	first := newStore(t, c)
	s1, crash := crashable(t, c)
	lk1, err := leasehold.New(s1, leasehold.Options{Name: "w1", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk1.Close() })
	lk2, err := leasehold.New(newStore(t, c), leasehold.Options{Name: "w2", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk2.Close() })
	key := uniqueKey(t, "k")
	ctx := ctxFor(t, 15*time.Second)
	if _, err := first.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "first", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		l  *leasehold.Lease
		at time.Time
	}
	wait := func(lk *leasehold.Locker, queued int) chan result {
		ch := make(chan result, 1)
		go func() {
			l, err := lk.Acquire(ctx, key)
			if err != nil {
				t.Error(err)
			}
			ch <- result{l, time.Now()}
		}()
		for {
			info, err := first.Inspect(ctx, key)
			if err == nil && info.Waiting == queued {
				return ch
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	got1 := wait(lk1, 1)
	got2 := wait(lk2, 2)
	time.Sleep(300 * time.Millisecond) // w2's last acquire answer is well before w1's grant
	if err := first.Release(ctx, key, "first"); err != nil {
		t.Fatal(err)
	}
	r1 := <-got1
	crash()
	if r1.l == nil {
		t.FailNow()
	}
	r2 := <-got2
	if r2.l == nil {
		t.FailNow()
	}
	defer r2.l.Release(ctx)
	lag := r2.at.Sub(r1.at.Add(ttl))
	t.Logf("taken over %v after the crashed holder's TTL (from its grant)", lag)
	if lag < -drift {
		t.Fatalf("taken over %v before the crashed holder's TTL, more than its drift margin %v", -lag, drift)
	}
	if lag > 600*time.Millisecond {
		t.Fatalf("taken over %v after the crashed holder's TTL, expected about at it", lag)
	}
	if r2.l.Fence() <= r1.l.Fence() {
		t.Fatalf("fence %d after the crashed holder's %d", r2.l.Fence(), r1.l.Fence())
	}
}

// The head of the queue takes a crashed holder's lock over in one
// transaction (it overwrites the lock, whose value then carries the
// fence), and the fence rules hold through it: greater than the crashed
// holder's, reported by Inspect, kept by a renewal that rewrites the lock
// and by a retried acquire (with the same or another TTL), and below the
// fence of the next acquisition.
func TestTakeoverIsOneTransaction(t *testing.T) {
	c := testetcd.Start(t)
	holder, crash := crashable(t, c)
	waiter, n := countingStore(t, c)
	other := newStore(t, c)
	key := uniqueKey(t, "k")
	warm(t, holder, key+"-warm")
	warm(t, waiter, key+"-warm")
	ctx := ctxFor(t, 20*time.Second)
	const ttl = time.Second
	g0, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "dead", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	crash()
	req := driver.AcquireRequest{Key: key, Token: "w", TTL: ttl, Holder: "holder-w", QueueTTL: 10 * time.Second}
	g, err := waiter.Acquire(ctx, req)
	if !errors.Is(err, leasehold.ErrNotAcquired) || g.Remaining <= 0 {
		t.Fatalf("waiter: expected ErrNotAcquired and the lock's time left, got %+v, %v", g, err)
	}
	time.Sleep(g.Remaining)
	n.take()
	g1, err := waiter.Acquire(ctx, req)
	if err != nil {
		t.Fatalf("takeover at the holder's TTL: %v", err)
	}
	if txns := n.take()[txnMethod]; txns != 1 {
		t.Fatalf("takeover: expected 1 transaction, got %d", txns)
	}
	if g1.Fence <= g0.Fence {
		t.Fatalf("takeover fence %d not above the crashed holder's %d", g1.Fence, g0.Fence)
	}
	expectFence := func(what string, want uint64) {
		t.Helper()
		info, err := other.Inspect(ctx, key)
		if err != nil || info.Fence != want || info.Token != "w" {
			t.Fatalf("%s: Inspect: expected token w with fence %d, got %+v, %v", what, want, info, err)
		}
	}
	expectFence("after the takeover", g1.Fence)
	// A waiter makes the renewal write the lock: the fence stays.
	expectWait(t, other, key, "next", time.Minute, 0)
	if err := waiter.Renew(ctx, key, "w", ttl); err != nil {
		t.Fatal(err)
	}
	expectFence("after a renewal that wrote the lock", g1.Fence)
	for _, d := range []time.Duration{ttl, 2 * ttl} {
		req.TTL = d
		if g, err := waiter.Acquire(ctx, req); err != nil || g.Fence != g1.Fence {
			t.Fatalf("retried acquire with TTL %v: expected fence %d, got %+v, %v", d, g1.Fence, g, err)
		}
		expectFence("after a retried acquire", g1.Fence)
	}
	if err := waiter.Release(ctx, key, "w"); err != nil {
		t.Fatal(err)
	}
	g2, err := acquireQ(t, other, key, "next", time.Minute)
	if err != nil || g2.Fence <= g1.Fence {
		t.Fatalf("next acquisition: expected a fence above %d, got %+v, %v", g1.Fence, g2, err)
	}
}
