package etcdstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Two Lockers with different WaiterTTLs on one Store: the longer one's
// KeepPresence must not end the places that the shorter one queued with
// Kept and keeps with its own KeepPresence every round (a place next in
// line is refreshed only every Kept/3).
func TestKeptPlaceOutlivesALongerPresence(t *testing.T) {
	c, _, s, ctx := startStore(t, 30*time.Second)
	h := newStore(t, c)
	key := uniqueKey(t, "k")
	if _, err := acquireQ(t, h, key, "h", 0); err != nil {
		t.Fatal(err)
	}
	const short, long = time.Second, 6 * time.Second
	if err := s.KeepPresence(ctx, short); err != nil { // A's keeper
		t.Fatal(err)
	}
	req := driver.AcquireRequest{Key: key, Token: "a", TTL: 10 * time.Second, QueueTTL: short, Kept: 20 * short}
	if _, err := s.Acquire(ctx, req); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	if err := s.KeepPresence(ctx, long); err != nil { // B's keeper
		t.Fatal(err)
	}
	for end := time.Now().Add(4 * long / 5); time.Now().Before(end); time.Sleep(short / 3) {
		if err := s.KeepPresence(ctx, short); err != nil { // A's keeper's rounds
			t.Fatal(err)
		}
	}
	errs := s.RefreshQueue(ctx, []driver.QueueRefresh{{Key: key, Token: "a", QueueTTL: short, Kept: 20 * short}})
	if errs[0] != nil {
		t.Fatalf("the place kept by A's presence: %v", errs[0])
	}
}

// A waiter next in line, whose place the presence keeps (refreshed only
// every 20 × WaiterTTL / 3), queues again within a few rounds once etcd lost
// the presence (a process paused for longer than WaiterTTL; here: revoked):
// the KeepPresence that finds it gone must not pass for a kept one.
func TestLostPresenceRequeuesItsHead(t *testing.T) {
	c, cli, s, ctx := startStore(t, 30*time.Second)
	h := newStore(t, c)
	key := uniqueKey(t, "k")
	if _, err := acquireQ(t, h, key, "h", 0); err != nil {
		t.Fatal(err)
	}
	const waiterTTL = time.Second
	lk := newLocker(t, s, leasehold.Options{Name: "w", TTL: 10 * time.Second, WaiterTTL: waiterTTL})
	go func() { _, _ = lk.Acquire(ctx, key) }()
	entry := func() (clientv3.LeaseID, bool) {
		r, err := cli.Get(ctx, "lh-test/"+key+"\x00", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Kvs) == 0 {
			return 0, false
		}
		return clientv3.LeaseID(r.Kvs[0].Lease), true
	}
	time.Sleep(2 * waiterTTL) // the keeper's first rounds put the place on the presence
	l, ok := entry()
	if !ok {
		t.Fatal("the waiter's place is not queued")
	}
	if _, err := cli.Revoke(ctx, l); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*waiterTTL, func() bool { _, ok := entry(); return ok })
}

// An acquire whose lock lease etcd no longer knows (revoked; or an acquire
// queued past its lease) must not make the Store forget its live presence:
// the places on it are still kept by the next KeepPresence calls.
func TestPresenceOutlivesAnUnknownLockLease(t *testing.T) {
	c, cli, s, ctx := startStore(t, 30*time.Second)
	h := newStore(t, c)
	key := uniqueKey(t, "k")
	if _, err := acquireQ(t, h, key, "h", 0); err != nil {
		t.Fatal(err)
	}
	const ttl = time.Second
	if err := s.KeepPresence(ctx, ttl); err != nil {
		t.Fatal(err)
	}
	kept := driver.AcquireRequest{Key: key, TTL: 10 * time.Second, QueueTTL: ttl, Kept: 20 * ttl}
	kept.Token = "a" // next in line, on the presence
	if _, err := s.Acquire(ctx, kept); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	other := uniqueKey(t, "other")
	if _, err := acquireQ(t, s, other, "o", 0); err != nil { // the current lease of the lock's class
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, leaseOf(t, cli, "lh-test/"+other)); err != nil {
		t.Fatal(err)
	}
	free := kept // a waiting acquire of a free key, on the revoked lease: refused by etcd, sent again
	free.Key, free.Token = uniqueKey(t, "free"), "b"
	if _, err := s.Acquire(ctx, free); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(4 * ttl); time.Now().Before(end); time.Sleep(ttl / 3) {
		_ = s.KeepPresence(ctx, ttl) // the keeper's rounds
	}
	errs := s.RefreshQueue(ctx, []driver.QueueRefresh{{Key: key, Token: "a", QueueTTL: ttl, Kept: 20 * ttl}})
	if errs[0] != nil {
		t.Fatalf("the place kept by the presence: %v", errs[0])
	}
}

// A refresh of places the presence keeps is a read: etcd commits no raft
// proposal for it (a transaction with a nested one, or with a put, goes
// through raft), also when one of them is not queued (here: never was): the
// others are read again, not moved.
func TestKeptRefreshIsARead(t *testing.T) {
	c, cli, s, ctx := startStore(t, 30*time.Second)
	h := newStore(t, c)
	a, b := uniqueKey(t, "a"), uniqueKey(t, "b")
	for _, k := range []string{a, b} {
		if _, err := acquireQ(t, h, k, "h", 0); err != nil {
			t.Fatal(err)
		}
	}
	const ttl = time.Second
	if err := s.KeepPresence(ctx, ttl); err != nil {
		t.Fatal(err)
	}
	refresh := func(tokens ...string) []error {
		var reqs []driver.QueueRefresh
		for i, k := range []string{a, b, a} {
			if i < len(tokens) {
				reqs = append(reqs, driver.QueueRefresh{Key: k, Token: tokens[i], QueueTTL: ttl, Kept: 20 * ttl})
			}
		}
		return s.RefreshQueue(ctx, reqs)
	}
	for _, r := range []driver.QueueRefresh{{Key: a, Token: "wa"}, {Key: b, Token: "wb"}} {
		req := driver.AcquireRequest{Key: r.Key, Token: r.Token, TTL: 10 * time.Second, QueueTTL: ttl, Kept: 20 * ttl}
		if _, err := s.Acquire(ctx, req); !errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("expected ErrNotAcquired, got %v", err)
		}
	}
	proposals := func() float64 { return c.Metric(t, 0, "etcd_server_proposals_committed_total") }
	const rounds = 20
	p0 := proposals()
	for range rounds {
		if errs := refresh("wa", "wb"); errs[0] != nil || errs[1] != nil {
			t.Fatalf("expected both places kept behind their holders, got %v", errs)
		}
	}
	if n := proposals() - p0; n >= rounds/2 {
		t.Fatalf("%d refreshes of kept places committed %v raft proposals: not a read", rounds, n)
	}
	if _, err := cli.Delete(ctx, "lh-test/"+b); err != nil { // b's lock expires
		t.Fatal(err)
	}
	if errs := refresh("wa", "wb"); errs[0] != nil || !errors.Is(errs[1], leasehold.ErrNotHeld) {
		t.Fatalf("expected nil and ErrNotHeld, got %v", errs)
	}
	p0 = proposals()
	for range rounds / 4 {
		if errs := refresh("wa", "wb", "x"); errs[0] != nil || !errors.Is(errs[1], leasehold.ErrNotHeld) || !errors.Is(errs[2], driver.ErrNotQueued) {
			t.Fatalf("expected nil, ErrNotHeld and ErrNotQueued, got %v", errs)
		}
	}
	if n := proposals() - p0; n >= rounds/4 {
		t.Fatalf("%d refreshes with a place not queued committed %v raft proposals: the others were moved, not read", rounds/4, n)
	}
}

// A lock handed to a kept place is on the Store's presence until its holder
// renews it. One its holder neither renews nor releases (a release lost in a
// failover) is deleted by the Store's next KeepPresence past the grant's
// TTL, not kept as long as the presence; a renewed one is left alone.
func TestStaleGrantOnThePresenceIsSwept(t *testing.T) {
	c, cli, s, ctx := startStore(t, 30*time.Second)
	h := newStore(t, c)
	const ttl = time.Second
	if err := s.KeepPresence(ctx, ttl); err != nil {
		t.Fatal(err)
	}
	grant := func(key string) driver.Wake {
		if _, err := acquireQ(t, h, key, "h", 0); err != nil {
			t.Fatal(err)
		}
		req := driver.AcquireRequest{Key: key, Token: "w", TTL: ttl, QueueTTL: ttl, Kept: 20 * ttl}
		if _, err := s.Acquire(ctx, req); !errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("expected ErrNotAcquired, got %v", err)
		}
		wake, stop, err := s.WaitRelease(ctx, key, "w")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		if err := h.Release(ctx, key, "h"); err != nil {
			t.Fatal(err)
		}
		return grantOn(t, ctx, wake)
	}
	stale, renewed := uniqueKey(t, "stale"), uniqueKey(t, "renewed")
	grant(stale)
	grant(renewed)
	if err := s.Renew(ctx, renewed, "w", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	held := func(key string) bool {
		r, err := cli.Get(ctx, "lh-test/"+key, clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return r.Count == 1
	}
	for end := time.Now().Add(4 * ttl); time.Now().Before(end); time.Sleep(ttl / 4) {
		if err := s.KeepPresence(ctx, ttl); err != nil { // the keeper's rounds
			t.Fatal(err)
		}
	}
	if held(stale) {
		t.Fatal("the grant nobody renewed or released is still held, kept by the presence")
	}
	if !held(renewed) {
		t.Fatal("the renewed grant was deleted")
	}
}

// grantOn returns the first wake-up on wake that carries a grant, failing
// the test when ctx ends first.
func grantOn(t *testing.T, ctx context.Context, wake <-chan driver.Wake) driver.Wake {
	t.Helper()
	for {
		select {
		case w := <-wake:
			if w.Fence != 0 {
				return w
			}
		case <-ctx.Done():
			t.Fatal("no grant")
		}
	}
}
