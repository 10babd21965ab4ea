package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/etcdstore"
	"github.com/leasehold/leasehold/etcdstore/internal/testetcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// uniqueKey returns a key unique to the test.
func uniqueKey(t *testing.T, suffix string) string {
	return fmt.Sprintf("%s:%d:%s", strings.ReplaceAll(t.Name(), "/", "."), time.Now().UnixNano(), suffix)
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func leaseOf(t *testing.T, cli *clientv3.Client, etcdKey string) clientv3.LeaseID {
	t.Helper()
	r, err := cli.Get(ctxFor(t, 5*time.Second), etcdKey)
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("get %s: expected one key, got %v, %v", etcdKey, r, err)
	}
	return clientv3.LeaseID(r.Kvs[0].Lease)
}

func expectHolder(t *testing.T, s *etcdstore.Store, key, token, holder string) {
	t.Helper()
	info, err := s.Inspect(ctxFor(t, 5*time.Second), key)
	if err != nil || info.Holder != holder || info.Token != token {
		t.Fatalf("Inspect: expected holder %q and token %q, got %+v, %v", holder, token, info, err)
	}
}

func TestKeyLayoutAndFence(t *testing.T) {
	_, cli, s, ctx := startStore(t, 10*time.Second)
	key := uniqueKey(t, "k")
	g, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "tok", TTL: 5 * time.Second, Holder: "host-1 pid 7"})
	if err != nil {
		t.Fatal(err)
	}
	// The runbook's `etcdctl get lh-test/KEY`: value = token NUL ttl-ms NUL
	// holder, fence = create revision.
	r, err := cli.Get(ctx, "lh-test/"+key)
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("raw get: expected the lock key, got %v, %v", r, err)
	}
	kv := r.Kvs[0]
	if string(kv.Value) != "tok\x005000\x00host-1 pid 7" || uint64(kv.CreateRevision) != g.Fence || kv.Lease == 0 {
		t.Fatalf("raw key: expected value tok NUL 5000 NUL holder, create revision %d and a lease, got %q %d %x", g.Fence, kv.Value, kv.CreateRevision, kv.Lease)
	}
	ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
	if err != nil || ttl.GrantedTTL != 6 {
		t.Fatalf("lease: expected granted TTL 6s (5s + 1s slack), got %v, %v", ttl, err)
	}
	expectHolder(t, s, key, "tok", "host-1 pid 7")
	// A write to an unrelated key moves the revision on; the next fence is above it.
	if _, err := cli.Put(ctx, "unrelated", "x"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, key, "tok"); err != nil {
		t.Fatal(err)
	}
	g2, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "tok2", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if g2.Fence <= g.Fence+2 { // + the unrelated put + the delete
		t.Fatalf("expected fence > %d, got %d", g.Fence+2, g2.Fence)
	}
}

// Locks whose TTLs round up to the same whole seconds, acquired within the
// second a lease serves, share the current etcd lease of that class,
// granted for those seconds plus one.
func TestLocksShareOneLeasePerTTL(t *testing.T) {
	_, cli, s, ctx := startStore(t, 20*time.Second)
	leases := map[time.Duration]clientv3.LeaseID{}
	for _, tc := range []struct {
		ttl     time.Duration
		granted int64
	}{
		{999 * time.Millisecond, 2}, // long enough to read its lease before etcd ends it
		{time.Second, 2},
		{1500 * time.Millisecond, 3},
		{2 * time.Second, 3},
		{61 * time.Second, 62},
	} {
		key := uniqueKey(t, tc.ttl.String())
		if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "t", TTL: tc.ttl}); err != nil {
			t.Fatal(err)
		}
		id := leaseOf(t, cli, "lh-test/"+key)
		r, err := cli.TimeToLive(ctx, id)
		if err != nil || r.GrantedTTL != tc.granted {
			t.Errorf("TTL %v: expected a lease of %ds, got %v, %v", tc.ttl, tc.granted, r, err)
		}
		leases[tc.ttl] = id
	}
	if leases[999*time.Millisecond] != leases[time.Second] || leases[1500*time.Millisecond] != leases[2*time.Second] {
		t.Errorf("expected locks of the same whole seconds on one lease, got %v", leases)
	}
	if leases[time.Second] == leases[2*time.Second] {
		t.Errorf("expected a lease per whole-second TTL, got %v", leases)
	}
	ls, err := cli.Leases(ctx)
	if err != nil || len(ls.Leases) != 3 {
		t.Fatalf("expected 3 leases for 5 locks, got %v, %v", ls, err)
	}
	for _, bad := range []time.Duration{0, -time.Second} {
		if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: uniqueKey(t, "bad"), Token: "t", TTL: bad}); !errors.Is(err, etcdstore.ErrInvalidTTL) {
			t.Errorf("Acquire with TTL %v: expected ErrInvalidTTL, got %v", bad, err)
		}
		if err := s.Renew(ctx, uniqueKey(t, "bad"), "t", bad); !errors.Is(err, etcdstore.ErrInvalidTTL) {
			t.Errorf("Renew with TTL %v: expected ErrInvalidTTL, got %v", bad, err)
		}
	}
}

// The server never expires a lock before the TTL the holder asked for (its
// local guard is measured from before the request), and does expire it within
// TTL rounded up + the leader's 500 ms expiry sweep (+ slack for a loaded
// machine).
func TestExpiryWholeSeconds(t *testing.T) {
	c := testetcd.Start(t)
	s := newStore(t, c)
	ctx := ctxFor(t, 20*time.Second)
	key := uniqueKey(t, "k")
	const ttl = 1500 * time.Millisecond
	sent := time.Now()
	f1, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "a", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	var gone time.Duration
	for {
		_, err := s.Inspect(ctx, key)
		if errors.Is(err, leasehold.ErrNotHeld) {
			gone = time.Since(sent)
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Since(sent) > 2*time.Second+500*time.Millisecond+3*time.Second {
			t.Fatalf("a %v lock (2 s lease) still held after %v", ttl, time.Since(sent))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if gone < ttl {
		t.Fatalf("the lock expired %v after the acquire was sent, before its TTL %v", gone, ttl)
	}
	if err := s.Renew(ctx, key, "a", ttl); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("Renew after expiry: expected ErrNotOwned, got %v", err)
	}
	ls, err := s.List(ctx, key)
	if err != nil || len(ls) != 0 {
		t.Fatalf("List after expiry: expected nothing, got %v, %v", ls, err)
	}
	g, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "b", TTL: ttl})
	if err != nil || g.Fence <= f1.Fence {
		t.Fatalf("acquire after expiry: expected fence > %d, got %v, %v", f1.Fence, g, err)
	}
}

func TestContentionReportsRemaining(t *testing.T) {
	c := testetcd.Start(t)
	s := newStore(t, c)
	ctx := ctxFor(t, 10*time.Second)
	key := uniqueKey(t, "k")
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "a", TTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	g, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "b", TTL: time.Second})
	if !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	if g.Remaining < 5*time.Second || g.Remaining > 10*time.Second {
		t.Fatalf("expected Remaining in [5s, 10s] (whole seconds, rounded down), got %v", g.Remaining)
	}
	if g.Fence != 0 {
		t.Fatalf("contention: expected fence 0, got %d", g.Fence)
	}
}

// A retry with the same token keeps the fence and moves the lock to the
// lease of its TTL; Renew with a longer TTL does the same.
func TestRetryAndLongerRenewMoveTheLease(t *testing.T) {
	_, cli, s, ctx := startStore(t, 20*time.Second)
	key := uniqueKey(t, "k")
	ek := "lh-test/" + key
	g1, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "tok", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l1 := leaseOf(t, cli, ek)
	g2, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "tok", TTL: 30 * time.Second})
	if err != nil || g2.Fence != g1.Fence {
		t.Fatalf("retry: expected fence %d, got %v, %v", g1.Fence, g2, err)
	}
	l2 := leaseOf(t, cli, ek)
	if l2 == l1 {
		t.Fatal("retry with another TTL: expected the key on another lease")
	}
	// Same TTL: a read, the lease stays.
	if err := s.Renew(ctx, key, "tok", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if l := leaseOf(t, cli, ek); l != l2 {
		t.Fatalf("renew with the granted TTL: expected lease %x, got %x", l2, l)
	}
	// Longer TTL: another lease, token-checked; the fence stays.
	if err := s.Renew(ctx, key, "tok", 90*time.Second); err != nil {
		t.Fatal(err)
	}
	if leaseOf(t, cli, ek) == l2 {
		t.Fatal("renew with a longer TTL: expected another lease")
	}
	info, err := s.Inspect(ctx, key)
	if err != nil || info.Fence != g1.Fence || info.Remaining < 60*time.Second {
		t.Fatalf("after the longer renew: expected fence %d with > 60s left, got %+v, %v", g1.Fence, info, err)
	}
	if err := s.Release(ctx, key, "tok"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, key, "tok"); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("second Release: expected ErrNotHeld, got %v", err)
	}
}

// A release proves its token by the lock's mod revision from the acquire,
// with one comparison over the key's range that a deleted lock also passes:
// a lock deleted behind the store's back (etcdctl del) still answers
// ErrNotHeld, and a waiter that queued since is still seen (the lock is
// handed to it, not deleted).
func TestReleaseByModRevision(t *testing.T) {
	c, cli, s, ctx := startStore(t, 20*time.Second)
	key := uniqueKey(t, "k")
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "tok", TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, "lh-test/"+key); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, key, "tok"); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("release of a deleted lock: expected ErrNotHeld, got %v", err)
	}

	key = uniqueKey(t, "w")
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "tok", TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	w := newStore(t, c)
	wreq := driver.AcquireRequest{Key: key, Token: "waiter", TTL: 5 * time.Second, Holder: "w", QueueTTL: 5 * time.Second}
	if _, err := w.Acquire(ctx, wreq); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("waiter: expected ErrNotAcquired, got %v", err)
	}
	if err := s.Release(ctx, key, "tok"); err != nil {
		t.Fatal(err)
	}
	info, err := s.Inspect(ctx, key)
	if err != nil || info.Token != "waiter" {
		t.Fatalf("after the release: expected the key granted to the waiter, got %+v, %v", info, err)
	}
}

// Releases from 16 goroutines of one store go in batches (fewer release
// transactions than releases) and each still answers for its own lock:
// deleted, or ErrNotHeld for a lock deleted behind the store's back.
func TestConcurrentReleasesBatch(t *testing.T) {
	c := testetcd.Start(t)
	cli := c.Client(t)
	s, n := countingStore(t, c)
	ctx := ctxFor(t, 60*time.Second)
	base := uniqueKey(t, "b")
	const goroutines, rounds = 16, 30
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*rounds)
	n.take()
	for i := range goroutines {
		wg.Go(func() {
			for j := range rounds {
				key := fmt.Sprintf("%s%d", base, i)
				tok := fmt.Sprintf("t%d-%d", i, j)
				if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: tok, TTL: 10 * time.Second}); err != nil {
					errs <- err
					return
				}
				gone := j%3 == 0
				if gone {
					if _, err := cli.Delete(ctx, "lh-test/"+key); err != nil {
						errs <- err
						return
					}
				}
				err := s.Release(ctx, key, tok)
				switch {
				case gone && !errors.Is(err, leasehold.ErrNotHeld):
					errs <- fmt.Errorf("%s %s: release of a deleted lock: expected ErrNotHeld, got %v", key, tok, err)
				case !gone && err != nil:
					errs <- fmt.Errorf("%s %s: release: %w", key, tok, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	txns := n.take()["/etcdserverpb.KV/Txn"]
	if txns >= 2*goroutines*rounds {
		t.Errorf("%d acquires and releases on 16 goroutines: expected the releases batched (fewer than %d transactions), got %d", goroutines*rounds, 2*goroutines*rounds, txns)
	}
	for i := range goroutines {
		if _, err := s.Inspect(ctx, fmt.Sprintf("%s%d", base, i)); !errors.Is(err, leasehold.ErrNotHeld) {
			t.Errorf("key %d after the releases: expected ErrNotHeld, got %v", i, err)
		}
	}
	t.Logf("%d transactions for %d acquires and releases", txns, goroutines*rounds)
}

// An acquire retried through another Store (its process dialled etcd anew
// after the reply was lost) finds its own token: same fence, no queue entry
// left behind. A Store sends its first acquire of a token without the retry
// check, so this is the case that must fall back to it.
func TestRetryThroughAnotherStore(t *testing.T) {
	c := testetcd.Start(t)
	cli := c.Client(t)
	ctx := ctxFor(t, 20*time.Second)
	for _, queue := range []time.Duration{0, 10 * time.Second} {
		t.Run(fmt.Sprintf("QueueTTL=%v", queue), func(t *testing.T) {
			a, b := newStore(t, c), newStore(t, c)
			key := uniqueKey(t, "k")
			g1, err := a.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "tok", TTL: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			g2, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "tok", TTL: 5 * time.Second, QueueTTL: queue})
			if err != nil || g2.Fence != g1.Fence {
				t.Fatalf("retry through another store: expected fence %d, got %+v, %v", g1.Fence, g2, err)
			}
			if err := b.Release(ctx, key, "tok"); err != nil {
				t.Fatalf("Release through the other store: %v", err)
			}
			r, err := cli.Get(ctx, "lh-test/"+key, clientv3.WithPrefix())
			if err != nil || len(r.Kvs) != 0 {
				t.Fatalf("after Release: expected no lock and no queue entry, got %v, %v", r.Kvs, err)
			}
		})
	}
}

// Expiry deletes the key, so a watcher wakes on expiry too (unlike Redis
// pub/sub), and a new acquisition (a put) wakes nobody.
func TestWaitReleaseWakesOnExpiry(t *testing.T) {
	c := testetcd.Start(t)
	s := newStore(t, c)
	ctx := ctxFor(t, 20*time.Second)
	key := uniqueKey(t, "k")
	ch, stop, err := s.WaitRelease(ctx, key, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	select { // the key is free: the waiter may take it now
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("no wake-up for a free key")
	}
	sent := time.Now()
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "a", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
		if el := time.Since(sent); el < time.Second {
			t.Fatalf("woke %v after the acquire, before the 1s lease could expire (a put woke the waiter?)", el)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notification within 10s of a 1s lock expiring")
	}
	stop()
	stop() // idempotent
}

func TestWaitReleaseEndsWithContext(t *testing.T) {
	c := testetcd.Start(t)
	s := newStore(t, c)
	key := uniqueKey(t, "k")
	if _, err := s.Acquire(ctxFor(t, 5*time.Second), driver.AcquireRequest{Key: key, Token: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ch, stop, err := s.WaitRelease(ctx, key, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	cancel()
	if err := s.Release(ctxFor(t, 5*time.Second), key, "a"); err != nil {
		t.Fatal(err)
	}
	// The subscription ended with its context (goleak checks the watch
	// goroutine ends with the store) and stop still returns.
	select {
	case <-ch:
		t.Fatal("a cancelled subscription must not report a release")
	case <-time.After(300 * time.Millisecond):
	}
}

func TestClosedAndBadInput(t *testing.T) {
	if _, err := etcdstore.New(nil, etcdstore.Options{}); !errors.Is(err, etcdstore.ErrInvalidOptions) {
		t.Fatalf("New(nil): expected ErrInvalidOptions, got %v", err)
	}
	c := testetcd.Start(t)
	s, err := etcdstore.New(c.Client(t), etcdstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Prefix() != etcdstore.DefaultPrefix {
		t.Fatalf("expected default prefix %q, got %q", etcdstore.DefaultPrefix, s.Prefix())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ctx := ctxFor(t, 5*time.Second)
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Second}); !errors.Is(err, etcdstore.ErrClosed) {
		t.Fatalf("Acquire after Close: expected ErrClosed, got %v", err)
	}
	if _, _, err := s.WaitRelease(ctx, "k", "w"); !errors.Is(err, etcdstore.ErrClosed) {
		t.Fatalf("WaitRelease after Close: expected ErrClosed, got %v", err)
	}
	// The client was the caller's: still open.
	if _, err := s.Client().Get(ctx, "x"); err != nil {
		t.Fatalf("client after Store.Close: expected it open, got %v", err)
	}
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url       string
		endpoints []string
		user      string
		prefix    string
		err       string
	}{
		{url: "etcd://127.0.0.1:2379", endpoints: []string{"127.0.0.1:2379"}},
		{url: "etcd://a:1,b:2,c:3/", endpoints: []string{"a:1", "b:2", "c:3"}},
		{url: "etcd://app:s3cr%40t@a:1?prefix=jobs/", endpoints: []string{"a:1"}, user: "app", prefix: "jobs/"},
		{url: "redis://a:1", err: "must start with etcd://"},
		{url: "etcd://", err: "no host:port"},
		{url: "etcd://a", err: `"a" needs host:port`},
		{url: "etcd://a:1/path", err: "takes no path"},
		{url: "etcd://a:1?pool=3", err: `unknown etcd URL parameter "pool"`},
		{url: "etcd://:hunter2@a:1", err: "without a user name"},
		{url: "etcd://app@a:1", err: "must be user:password"},
	} {
		cfg, prefix, err := etcdstore.ParseURL(tc.url)
		if tc.err != "" {
			if !errors.Is(err, etcdstore.ErrInvalidOptions) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: expected ErrInvalidOptions containing %q, got %v", tc.url, tc.err, err)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("%s: the error shows the password: %v", tc.url, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		if fmt.Sprint(cfg.Endpoints) != fmt.Sprint(tc.endpoints) || cfg.Username != tc.user || prefix != tc.prefix {
			t.Errorf("%s: expected %v user %q prefix %q, got %v user %q prefix %q", tc.url, tc.endpoints, tc.user, tc.prefix, cfg.Endpoints, cfg.Username, prefix)
		}
		if tc.user != "" && cfg.Password != "s3cr@t" {
			t.Errorf("%s: expected the decoded password", tc.url)
		}
	}
}

func TestOpen(t *testing.T) {
	c := testetcd.Start(t)
	ctx := ctxFor(t, 10*time.Second)
	host := strings.TrimPrefix(c.Members[0].ClientURL, "http://")
	s, err := etcdstore.OpenURL(ctx, "etcd://"+host+"?prefix=opened/", etcdstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	r, err := c.Client(t).Get(ctx, "opened/k")
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("expected the lock under the URL's prefix, got %v, %v", r, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client().Get(ctx, "x"); err == nil {
		t.Fatal("Close of an opened store: expected its client closed")
	}

	s2, err := etcdstore.Open(ctx, c.Endpoints(), etcdstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = s2.Close()

	// Nothing listens on a fresh free port: Open fails within its context.
	dead := testetcd.Start(t)
	deadEP := dead.Endpoints()
	dead.Close()
	start := time.Now()
	dctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if _, err := etcdstore.Open(dctx, deadEP, etcdstore.Options{}); err == nil || !strings.Contains(err.Error(), "does not answer") {
		t.Fatalf("Open of a stopped member: expected a \"does not answer\" error, got %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("Open of a stopped member took %v, expected to end with its 1s context", el)
	}
	// With credentials the client authenticates while it dials: that too
	// must end with the context, and the password must not show.
	// The endpoint accepts connections and never answers.
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	start = time.Now()
	actx, acancel := context.WithTimeout(t.Context(), time.Second)
	defer acancel()
	_, err = etcdstore.OpenURL(actx, "etcd://root:hunter2@"+mute.Addr().String(), etcdstore.Options{})
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("OpenURL with credentials of a stopped member: expected an error without the password, got %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("OpenURL with credentials of a stopped member took %v, expected to end with its 1s context", el)
	}
	if _, err := etcdstore.Open(ctx, nil, etcdstore.Options{}); !errors.Is(err, etcdstore.ErrInvalidOptions) {
		t.Fatalf("Open without endpoints: expected ErrInvalidOptions, got %v", err)
	}
}

// A batch larger than one etcd transaction may hold (128 operations) is
// split, and every owned lock in it is renewed; a TTL that grew past the
// lease's falls back to moving the key to a longer lease.
func TestRenewBatchSplitsLargeBatches(t *testing.T) {
	c := testetcd.Start(t)
	s := newStore(t, c)
	ctx := ctxFor(t, 30*time.Second)
	reqs := make([]driver.RenewRequest, 150)
	// A TTL that outlasts 150 acquires on a loaded machine: the store
	// deletes a lock nobody renewed within its TTL.
	const ttl = 20 * time.Second
	for i := range reqs {
		key := uniqueKey(t, fmt.Sprintf("b%d", i))
		if _, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "me", TTL: ttl}); err != nil {
			t.Fatal(err)
		}
		reqs[i] = driver.RenewRequest{Key: key, Token: "me", TTL: ttl}
	}
	reqs[149].TTL = 2 * time.Minute // grows past its 20 s lease
	reqs[7].Token = "intruder"
	errs := s.RenewBatch(ctx, reqs)
	for i, err := range errs {
		switch {
		case i == 7 && !errors.Is(err, leasehold.ErrNotOwned):
			t.Fatalf("request 7 (wrong token): expected ErrNotOwned, got %v", err)
		case i != 7 && err != nil:
			t.Fatalf("request %d: expected a renewal, got %v", i, err)
		}
	}
	if info, err := s.Inspect(ctx, reqs[149].Key); err != nil || info.Remaining < time.Minute {
		t.Fatalf("expected the grown TTL to hold (> 1m left), got %v, %v", info.Remaining, err)
	}
}
