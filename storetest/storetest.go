// Package storetest is the conformance suite every driver.Store must pass
// against its real server: mutual exclusion under 100 concurrent acquirers,
// fences, token checks, expiry, inspect and list, release notifications, and
// store failures that are never mistaken for contention.
//
// A store package runs it from a test:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness{New: func(t *testing.T) driver.Store { ... }})
//	}
package storetest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
)

// Harness tells Run how to get a store and, optionally, how to break it.
type Harness struct {
	// New returns a store to test. Subtests use unique keys, so New may
	// return the same store, or stores over the same server, every time; it
	// should register cleanup (closing the store) with t.Cleanup. Without
	// Replica, stores returned for one t must share their data: they serve
	// as separate replicas of one server.
	New func(t *testing.T) driver.Store

	// Break makes s fail (stop the server, cut the connection); Heal undoes
	// it. Both optional: without Break the "store errors" subtest is skipped.
	// Heal may lose the store's data (a restart without persistence).
	Break func(t *testing.T, s driver.Store)
	Heal  func(t *testing.T, s driver.Store)

	// FencesAhead, when set, moves s's fence counters for keys far ahead
	// (10^12 µs) of the store's clock, as after the clock stepped back; the
	// Torture subtest then runs a second time after calling it. Optional.
	FencesAhead func(t *testing.T, s driver.Store, keys []string)

	// Leftovers lists the server-side state left behind by the stores of
	// the harness (lock keys, queue entries, leases, rows), except the
	// documented fence state, one description per item. The suite calls it
	// after every store it created in a subtest was closed (New's
	// t.Cleanup), and expects nothing. Optional: without it the
	// "NothingLeftAfterClose" subtest is skipped.
	Leftovers func(t *testing.T) []string

	// Slack is added to every timing bound, for slow stores or machines.
	// Default 0; the bounds are already generous.
	Slack time.Duration

	// Replica returns another client of the data behind s: a separate store
	// instance with its own connections, as another process would have. The
	// queue subtests run every replica (holder, waiters) on its own. Nil
	// means New(t), which suits stores whose New connects to one shared
	// server; an in-process store returns s.
	Replica func(t *testing.T, s driver.Store) driver.Store

	// Freeze makes the server behind s stop answering without closing
	// connections (SIGSTOP, a black-holing proxy): every call hangs until its
	// context ends. thaw undoes it. Optional: without it the subtests that
	// need a hung server are skipped.
	Freeze func(t *testing.T, s driver.Store) (thaw func())

	// HangNotify makes only the notification path of s hang (a new
	// subscription is never confirmed) while its other calls work; restore
	// undoes it. Optional: without it the notification-deadline subtest uses
	// Freeze.
	HangNotify func(t *testing.T, s driver.Store) (restore func())
}

// Run runs the conformance suite as subtests of t. The subtests run one after
// the other; the "store errors" subtest runs last.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("storetest: Harness.New is nil")
	}
	r := &runner{h: h, run: fmt.Sprintf("%x", time.Now().UnixNano())}
	t.Run("ExactlyOneWinner", r.exactlyOneWinner)
	t.Run("FencesIncrease", r.fencesIncrease)
	t.Run("SameTokenRetry", r.sameTokenRetry)
	t.Run("TokenCheckedRenewRelease", r.tokenChecked)
	t.Run("Expiry", r.expiry)
	t.Run("InspectList", r.inspectList)
	t.Run("ForceRelease", r.forceRelease)
	t.Run("RenewBatch", r.renewBatch)
	t.Run("ReleaseNotification", r.notification)
	t.Run("LockerHandOff", r.lockerHandOff)
	t.Run("Torture", r.torture)
	t.Run("LockerCloseCleansUp", r.lockerCloseCleansUp)
	t.Run("NothingLeftAfterClose", r.nothingLeftAfterClose)
	t.Run("Queue", r.queue)
	t.Run("Election", r.election)
	t.Run("StoreErrorsAreNotContention", r.storeErrors)
}

type runner struct {
	h   Harness
	run string // unique per Run, so reruns on a persistent server do not collide
}

// fullStore is a store with the optional capabilities the suite checks.
type fullStore interface {
	driver.Store
	driver.Inspector
}

// store returns a new store from the harness; the suite needs Inspector.
func (r *runner) store(t *testing.T) fullStore {
	t.Helper()
	s := r.h.New(t)
	fs, ok := s.(fullStore)
	if !ok {
		t.Fatalf("storetest: %T does not implement driver.Inspector", s)
	}
	return fs
}

// key returns a key unique to the subtest and this run.
func (r *runner) key(t *testing.T, suffix string) string {
	return fmt.Sprintf("storetest:%s:%s:%s", r.run, strings.ReplaceAll(t.Name(), "/", "."), suffix)
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustAcquire(t *testing.T, s driver.Store, key, token string, ttl time.Duration) uint64 {
	t.Helper()
	g, err := s.Acquire(ctxFor(t, 5*time.Second), driver.AcquireRequest{Key: key, Token: token, TTL: ttl})
	if err != nil {
		t.Fatalf("Acquire(%q, %q): expected success, got %v", key, token, err)
	}
	if g.Fence == 0 {
		t.Fatalf("Acquire(%q, %q): expected a fence > 0, got 0", key, token)
	}
	return g.Fence
}

func mustRelease(t *testing.T, s driver.Store, key, token string) {
	t.Helper()
	if err := s.Release(ctxFor(t, 5*time.Second), key, token); err != nil {
		t.Fatalf("Release(%q, %q): expected success, got %v", key, token, err)
	}
}

func (r *runner) exactlyOneWinner(t *testing.T) {
	s := r.store(t)
	key := r.key(t, "k")
	const n = 100
	var last uint64
	for round := range 3 {
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			winners = make(chan string, n)
			errs    = make(chan error, n)
			fences  = make(chan uint64, n)
		)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				tok := fmt.Sprintf("r%d-g%d", round, i)
				g, err := s.Acquire(ctxFor(t, 10*time.Second), driver.AcquireRequest{Key: key, Token: tok, TTL: time.Minute})
				switch {
				case err == nil:
					winners <- tok
					fences <- g.Fence
				case errors.Is(err, leasehold.ErrNotAcquired):
				default:
					errs <- err
				}
			}()
		}
		close(start)
		wg.Wait()
		close(winners)
		close(errs)
		close(fences)
		for err := range errs {
			t.Errorf("round %d: expected success or ErrNotAcquired, got %v", round, err)
		}
		var won []string
		for w := range winners {
			won = append(won, w)
		}
		if len(won) != 1 {
			t.Fatalf("round %d: expected exactly 1 winner among %d, got %d: %v", round, n, len(won), won)
		}
		f := <-fences
		if f <= last {
			t.Fatalf("round %d: expected fence > %d, got %d", round, last, f)
		}
		last = f
		mustRelease(t, s, key, won[0])
	}
}

func (r *runner) fencesIncrease(t *testing.T) {
	s := r.store(t)
	key := r.key(t, "k")
	var last uint64
	check := func(step string, f uint64) {
		t.Helper()
		if f <= last {
			t.Fatalf("%s: expected fence > %d, got %d", step, last, f)
		}
		last = f
	}
	for i := range 20 { // release and re-acquire, alternating owners
		tok := fmt.Sprintf("t%d", i)
		check(fmt.Sprintf("acquire %d", i), mustAcquire(t, s, key, tok, time.Minute))
		mustRelease(t, s, key, tok)
	}
	// Re-acquire after expiry.
	check("before expiry", mustAcquire(t, s, key, "short", 50*time.Millisecond))
	deadline := time.Now().Add(5*time.Second + r.h.Slack)
	for {
		g, err := s.Acquire(ctxFor(t, 5*time.Second), driver.AcquireRequest{Key: key, Token: "after-expiry", TTL: time.Minute})
		if err == nil {
			check("after expiry", g.Fence)
			break
		}
		if !errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("acquire after expiry: expected success or ErrNotAcquired, got %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("a 50ms lock still held after 5s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Another key has its own lock, and the first key's fence keeps growing.
	other := r.key(t, "other")
	if f := mustAcquire(t, s, other, "x", time.Minute); f == 0 {
		t.Fatal("expected a fence for another key")
	}
	mustRelease(t, s, key, "after-expiry")
	check("after another key", mustAcquire(t, s, key, "again", time.Minute))
}

func (r *runner) sameTokenRetry(t *testing.T) {
	s := r.store(t)
	key := r.key(t, "k")
	f1 := mustAcquire(t, s, key, "tok", 300*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	f2 := mustAcquire(t, s, key, "tok", time.Minute) // the retry after a lost reply
	if f2 != f1 {
		t.Fatalf("same-token retry: expected the same fence %d, got %d", f1, f2)
	}
	// The retry extended the TTL: the lock outlives the first 300 ms.
	time.Sleep(400 * time.Millisecond)
	info, err := s.Inspect(ctxFor(t, 5*time.Second), key)
	if err != nil {
		t.Fatalf("Inspect after the retry extended the TTL: expected the lock, got %v", err)
	}
	if info.Token != "tok" || info.Fence != f1 {
		t.Fatalf("Inspect: expected token tok fence %d, got token %q fence %d", f1, info.Token, info.Fence)
	}
	if _, err := s.Acquire(ctxFor(t, 5*time.Second), driver.AcquireRequest{Key: key, Token: "other", TTL: time.Minute}); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("another token: expected ErrNotAcquired, got %v", err)
	}
}

func (r *runner) tokenChecked(t *testing.T) {
	s := r.store(t)
	ctx := ctxFor(t, 10*time.Second)
	key := r.key(t, "k")
	f := mustAcquire(t, s, key, "owner", 2*time.Second)

	g, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "intruder", TTL: time.Minute})
	if !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("Acquire by another token: expected ErrNotAcquired, got %v", err)
	}
	if g.Remaining <= 0 || g.Remaining > 2*time.Second {
		t.Fatalf("Acquire by another token: expected Remaining in (0, 2s], got %v", g.Remaining)
	}
	if err := s.Renew(ctx, key, "intruder", time.Hour); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("Renew with a wrong token: expected ErrNotOwned, got %v", err)
	}
	if err := s.Release(ctx, key, "intruder"); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("Release with a wrong token: expected ErrNotOwned, got %v", err)
	}
	info, err := s.Inspect(ctx, key)
	if err != nil {
		t.Fatalf("Inspect: expected the owner's lock to be untouched, got %v", err)
	}
	if info.Token != "owner" || info.Fence != f {
		t.Fatalf("Inspect: expected token owner fence %d, got %q %d", f, info.Token, info.Fence)
	}
	if info.Remaining > 2*time.Second {
		t.Fatalf("wrong-token Renew extended the TTL: remaining %v > 2s", info.Remaining)
	}
	// The owner renews.
	if err := s.Renew(ctx, key, "owner", time.Minute); err != nil {
		t.Fatalf("Renew by the owner: expected success, got %v", err)
	}
	if err := s.Renew(ctx, key, "owner", time.Minute); err != nil {
		t.Fatalf("second Renew by the owner: expected success, got %v", err)
	}
	if info, err = s.Inspect(ctx, key); err != nil || info.Remaining < 30*time.Second {
		t.Fatalf("after Renew(1m): expected remaining > 30s, got %v, %v", info.Remaining, err)
	}
	mustRelease(t, s, key, "owner")
	if err := s.Release(ctx, key, "owner"); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("second Release (the key is gone): expected ErrNotHeld, got %v", err)
	}
	if err := s.Renew(ctx, key, "owner", time.Minute); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("Renew after Release: expected ErrNotOwned, got %v", err)
	}
	if _, err := s.Inspect(ctx, key); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("Inspect after Release: expected ErrNotHeld, got %v", err)
	}
}

// renewBatch checks driver.BatchRenewer, for stores that have it: one
// result per request, in order, each token-checked as Renew is.
func (r *runner) renewBatch(t *testing.T) {
	s := r.store(t)
	br, ok := s.(driver.BatchRenewer)
	if !ok {
		t.Skip("store does not implement driver.BatchRenewer")
	}
	ctx := ctxFor(t, 10*time.Second)
	owned1, owned2, other, free := r.key(t, "a"), r.key(t, "b"), r.key(t, "c"), r.key(t, "d")
	f1 := mustAcquire(t, s, owned1, "me", 2*time.Second)
	mustAcquire(t, s, owned2, "me", 2*time.Second)
	mustAcquire(t, s, other, "someone", 2*time.Second)
	errs := br.RenewBatch(ctx, []driver.RenewRequest{
		{Key: owned1, Token: "me", TTL: time.Minute},
		{Key: other, Token: "me", TTL: time.Minute},
		{Key: free, Token: "me", TTL: time.Minute},
		{Key: owned2, Token: "me", TTL: time.Minute},
	})
	if len(errs) != 4 {
		t.Fatalf("RenewBatch: expected 4 results, got %d", len(errs))
	}
	if errs[0] != nil || errs[3] != nil {
		t.Fatalf("RenewBatch of owned locks: expected nil, got %v and %v", errs[0], errs[3])
	}
	if !errors.Is(errs[1], leasehold.ErrNotOwned) || !errors.Is(errs[2], leasehold.ErrNotOwned) {
		t.Fatalf("RenewBatch of another owner's and of a free key: expected ErrNotOwned, got %v and %v", errs[1], errs[2])
	}
	for _, k := range []string{owned1, owned2} {
		if info, err := s.Inspect(ctx, k); err != nil || info.Remaining < 30*time.Second {
			t.Fatalf("after RenewBatch(1m): expected %s to have > 30s left, got %v, %v", k, info.Remaining, err)
		}
	}
	if info, err := s.Inspect(ctx, other); err != nil || info.Token != "someone" || info.Remaining > 2*time.Second {
		t.Fatalf("RenewBatch with a wrong token touched the owner's lock: %+v, %v", info, err)
	}
	if _, err := s.Inspect(ctx, free); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("RenewBatch created a lock on a free key: %v", err)
	}
	if info, _ := s.Inspect(ctx, owned1); info.Fence != f1 {
		t.Fatalf("RenewBatch changed the fence: expected %d, got %d", f1, info.Fence)
	}
	if errs := br.RenewBatch(ctx, nil); len(errs) != 0 {
		t.Fatalf("RenewBatch(nil): expected no results, got %v", errs)
	}
}

func (r *runner) expiry(t *testing.T) {
	s := r.store(t)
	ctx := ctxFor(t, 20*time.Second)
	key := r.key(t, "k")
	const ttl = 150 * time.Millisecond
	start := time.Now()
	mustAcquire(t, s, key, "a", ttl)
	g, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "b", TTL: time.Minute})
	if !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("while held: expected ErrNotAcquired, got %v", err)
	}
	if g.Remaining > ttl {
		t.Fatalf("while held: expected Remaining <= %v, got %v", ttl, g.Remaining)
	}
	for {
		_, err := s.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "b", TTL: time.Minute})
		if err == nil {
			break
		}
		if !errors.Is(err, leasehold.ErrNotAcquired) {
			t.Fatalf("waiting for expiry: expected ErrNotAcquired, got %v", err)
		}
		if time.Since(start) > 3*time.Second+r.h.Slack {
			t.Fatalf("a %v lock was still held after 3s", ttl)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if el := time.Since(start); el < ttl-10*time.Millisecond {
		t.Fatalf("lock expired after %v, before its TTL %v", el, ttl)
	}
	if err := s.Renew(ctx, key, "a", time.Minute); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("Renew by the expired owner: expected ErrNotOwned, got %v", err)
	}
	if err := s.Release(ctx, key, "a"); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("Release by the expired owner: expected ErrNotOwned, got %v", err)
	}
	if info, err := s.Inspect(ctx, key); err != nil || info.Token != "b" {
		t.Fatalf("expected the new owner b, got %+v, %v", info, err)
	}
	// An expired lock is not listed nor inspectable.
	k2 := r.key(t, "gone")
	mustAcquire(t, s, k2, "a", 50*time.Millisecond)
	time.Sleep(200*time.Millisecond + r.h.Slack)
	if _, err := s.Inspect(ctx, k2); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("Inspect of an expired lock: expected ErrNotHeld, got %v", err)
	}
	ls, err := s.List(ctx, k2)
	if err != nil || len(ls) != 0 {
		t.Fatalf("List of an expired lock: expected none, got %v, %v", ls, err)
	}
}

func (r *runner) inspectList(t *testing.T) {
	s := r.store(t)
	ctx := ctxFor(t, 10*time.Second)
	base := r.key(t, "")
	if _, err := s.Inspect(ctx, base+"none"); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("Inspect of a free key: expected ErrNotHeld, got %v", err)
	}
	// Keys with characters that are special to globs and hash tags.
	names := []string{"b", "a", "c:1", "c:2", "c*x", "c[1]", "c{x}y", "c?", "d"}
	fences := map[string]uint64{}
	for i, n := range names {
		fences[base+n] = mustAcquire(t, s, base+n, fmt.Sprintf("tok%d", i), time.Minute)
	}
	info, err := s.Inspect(ctx, base+"c{x}y")
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if info.Key != base+"c{x}y" || info.Token != "tok6" || info.Fence != fences[base+"c{x}y"] {
		t.Fatalf("Inspect: expected key %q token tok6 fence %d, got %+v", base+"c{x}y", fences[base+"c{x}y"], info)
	}
	if info.Remaining <= 0 || info.Remaining > time.Minute {
		t.Fatalf("Inspect: expected Remaining in (0, 1m], got %v", info.Remaining)
	}

	keysOf := func(ls []driver.LockInfo) []string {
		var ks []string
		for _, l := range ls {
			ks = append(ks, strings.TrimPrefix(l.Key, base))
			if l.Fence != fences[l.Key] || l.Token == "" || l.Remaining <= 0 {
				t.Errorf("List entry %+v: expected fence %d, a token and a TTL", l, fences[l.Key])
			}
		}
		return ks
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"", []string{"a", "b", "c*x", "c:1", "c:2", "c?", "c[1]", "c{x}y", "d"}},
		{"c", []string{"c*x", "c:1", "c:2", "c?", "c[1]", "c{x}y"}},
		{"c:", []string{"c:1", "c:2"}},
		{"c*", []string{"c*x"}},
		{"c[", []string{"c[1]"}},
		{"c?", []string{"c?"}},
		{"c{", []string{"c{x}y"}},
		{"zz", nil},
	} {
		ls, err := s.List(ctx, base+tc.prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", tc.prefix, err)
		}
		got := keysOf(ls)
		if !sort.StringsAreSorted(got) {
			t.Errorf("List(%q): expected sorted keys, got %q", tc.prefix, got)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("List(%q): expected %q, got %q", tc.prefix, tc.want, got)
		}
	}
	mustRelease(t, s, base+"a", "tok1")
	ls, err := s.List(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	if got := keysOf(ls); len(got) != len(names)-1 || got[0] != "b" {
		t.Fatalf("List after releasing a: expected %d keys starting with b, got %q", len(names)-1, got)
	}
}

func (r *runner) forceRelease(t *testing.T) {
	s := r.store(t)
	fr, ok := s.(driver.ForceReleaser)
	if !ok {
		t.Skip("store does not implement driver.ForceReleaser")
	}
	ctx := ctxFor(t, 10*time.Second)
	key := r.key(t, "k")
	f := mustAcquire(t, s, key, "owner", time.Minute)
	info, err := fr.ForceRelease(ctx, key)
	if err != nil {
		t.Fatalf("ForceRelease: %v", err)
	}
	if info.Token != "owner" || info.Fence != f {
		t.Fatalf("ForceRelease: expected to report token owner fence %d, got %+v", f, info)
	}
	if _, err := fr.ForceRelease(ctx, key); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("second ForceRelease: expected ErrNotHeld, got %v", err)
	}
	if err := s.Release(ctx, key, "owner"); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("Release after ForceRelease (the key is gone): expected ErrNotHeld, got %v", err)
	}
	if f2 := mustAcquire(t, s, key, "next", time.Minute); f2 <= f {
		t.Fatalf("after ForceRelease: expected fence > %d, got %d", f, f2)
	}
}

func (r *runner) notification(t *testing.T) {
	s := r.store(t)
	n, ok := s.(driver.Notifier)
	if !ok {
		t.Skip("store does not implement driver.Notifier")
	}
	ctx := ctxFor(t, 20*time.Second)
	key, other := r.key(t, "k"), r.key(t, "other")
	mustAcquire(t, s, key, "a", time.Minute)
	mustAcquire(t, s, other, "a", time.Minute)

	ch, stop, err := n.WaitRelease(ctx, key, "w1")
	if err != nil {
		t.Fatalf("WaitRelease: %v", err)
	}
	defer stop()
	ch2, stop2, err := n.WaitRelease(ctx, key, "w2") // a second waiter on the same key
	if err != nil {
		t.Fatalf("second WaitRelease: %v", err)
	}
	defer stop2()
	drainAtOnce(ch)
	drainAtOnce(ch2)

	mustRelease(t, s, other, "a") // another key's release wakes nobody here
	select {
	case <-ch:
		t.Fatal("a release of another key woke the waiter")
	case <-time.After(200 * time.Millisecond):
	}
	if err := s.Release(ctx, key, "wrong"); !errors.Is(err, leasehold.ErrNotOwned) {
		t.Fatalf("Release with a wrong token: expected ErrNotOwned, got %v", err)
	}
	mustRelease(t, s, key, "a")
	for i, c := range []<-chan driver.Wake{ch, ch2} {
		select {
		case <-c:
		case <-time.After(5*time.Second + r.h.Slack):
			t.Fatalf("waiter %d: no release notification within 5s", i)
		}
	}
	// After stop no more values arrive (and nothing blocks).
	stop()
	mustAcquire(t, s, key, "b", time.Minute)
	mustRelease(t, s, key, "b")
	select {
	case <-ch2:
	case <-time.After(5*time.Second + r.h.Slack):
		t.Fatal("waiter 2 (still subscribed): no second notification within 5s")
	}
	select {
	case <-ch:
		t.Fatal("a stopped waiter received a notification")
	case <-time.After(100 * time.Millisecond):
	}
}

// lockerHandOff checks the store under the Locker: one locker's Acquire wakes
// promptly after another locker's Release. With a Notifier the wait cap is
// longer than the test's bound, so only the notification can wake it in time.
func (r *runner) lockerHandOff(t *testing.T) {
	s := r.store(t)
	_, notifies := s.(driver.Notifier)
	opts := leasehold.Options{Name: "storetest", TTL: 20 * time.Second}
	bound := 10 * time.Second // before the TTL: the waiter did not wait for expiry
	if notifies {
		opts.WaitCap = time.Minute
		bound = 3 * time.Second
	}
	bound += r.h.Slack
	a, err := leasehold.New(s, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := leasehold.New(s, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := ctxFor(t, 30*time.Second)
	key := r.key(t, "k")

	la, err := a.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if _, err := b.TryAcquire(ctx, key); !errors.Is(err, leasehold.ErrNotAcquired) {
		t.Fatalf("second locker TryAcquire: expected ErrNotAcquired, got %v", err)
	}
	type result struct {
		l   *leasehold.Lease
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	go func() {
		l, err := b.Acquire(ctx, key)
		got <- result{l, err, time.Now()}
	}()
	time.Sleep(200 * time.Millisecond) // let b subscribe and block
	released := time.Now()
	if err := la.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	res := <-got
	if res.err != nil {
		t.Fatalf("blocked Acquire: %v", res.err)
	}
	if wait := res.at.Sub(released); wait > bound {
		t.Fatalf("blocked Acquire woke %v after the release, expected within %v", wait, bound)
	}
	if res.l.Fence() <= la.Fence() {
		t.Fatalf("hand-off: expected fence > %d, got %d", la.Fence(), res.l.Fence())
	}
	if err := res.l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func (r *runner) storeErrors(t *testing.T) {
	if r.h.Break == nil {
		t.Skip("Harness.Break is nil")
	}
	s := r.store(t)
	key := r.key(t, "k")
	mustAcquire(t, s, key, "owner", time.Minute)
	r.h.Break(t, s)
	healed := false
	heal := func() {
		if !healed && r.h.Heal != nil {
			healed = true
			r.h.Heal(t, s)
		}
	}
	defer heal()

	isContention := func(err error) bool {
		return errors.Is(err, leasehold.ErrNotAcquired) || errors.Is(err, leasehold.ErrNotOwned) || errors.Is(err, leasehold.ErrNotHeld)
	}
	check := func(op string, err error) {
		switch {
		case err == nil:
			t.Errorf("%s on a broken store: expected an error, got nil", op)
		case isContention(err):
			t.Errorf("%s on a broken store: expected a store error, got contention/ownership error %v", op, err)
		}
	}
	ctx := func() context.Context { return ctxFor(t, 2*time.Second) }
	lk, err := leasehold.New(s, leasehold.Options{Name: "storetest", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	ops := map[string]func() error{
		"Acquire (held key)": func() error {
			_, err := s.Acquire(ctx(), driver.AcquireRequest{Key: key, Token: "intruder", TTL: time.Minute})
			return err
		},
		"Acquire (free key)": func() error {
			_, err := s.Acquire(ctx(), driver.AcquireRequest{Key: r.key(t, "free"), Token: "x", TTL: time.Minute})
			return err
		},
		"Renew":               func() error { return s.Renew(ctx(), key, "owner", time.Minute) },
		"Renew (wrong token)": func() error { return s.Renew(ctx(), key, "intruder", time.Minute) },
		"Release":             func() error { return s.Release(ctx(), key, "intruder") },
		"Inspect":             func() error { _, err := s.Inspect(ctx(), key); return err },
		"List":                func() error { _, err := s.List(ctx(), key); return err },
		"Locker.TryAcquire": func() error {
			// Through a Locker the failure is a *StoreError, never ErrNotAcquired.
			_, err := lk.TryAcquire(ctx(), r.key(t, "locker"))
			if err != nil && !errors.Is(err, leasehold.ErrStore) {
				t.Errorf("Locker.TryAcquire on a broken store: expected ErrStore, got %v", err)
			}
			return err
		},
	}
	if br, ok := s.(driver.BatchRenewer); ok {
		ops["RenewBatch"] = func() error {
			errs := br.RenewBatch(ctx(), []driver.RenewRequest{
				{Key: key, Token: "owner", TTL: time.Minute}, {Key: key, Token: "intruder", TTL: time.Minute},
			})
			if len(errs) != 2 {
				return fmt.Errorf("expected 2 results, got %d", len(errs))
			}
			if errs[0] == nil || isContention(errs[0]) {
				return errs[0]
			}
			return errs[1]
		}
	}
	var wg sync.WaitGroup // the ops run at once: a broken store may be slow to fail
	for op, f := range ops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			check(op, f())
		}()
	}
	wg.Wait()

	if r.h.Heal == nil {
		return
	}
	heal()
	// The store works again (after reconnecting).
	deadline := time.Now().Add(10*time.Second + r.h.Slack)
	for {
		_, err := s.Acquire(ctx(), driver.AcquireRequest{Key: r.key(t, "healed"), Token: "x", TTL: time.Minute})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after Heal: Acquire still fails after 10s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
