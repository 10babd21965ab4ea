package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leasehold/leasehold"
	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/testredis"
	"github.com/leasehold/leasehold/redisstore"
)

// waiting returns how many live waiters key has, by Inspect (the key is
// held).
func waiting(t *testing.T, s *redisstore.Store, key string) int {
	t.Helper()
	info, err := s.Inspect(t.Context(), key)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	return info.Waiting
}

// A Store over a Ring (or a Cluster) keeps no presence: a script cannot
// read a key on another node.
func TestPresenceUnsupportedOffOneNode(t *testing.T) {
	srv := testredis.Start(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srv.Addr}, ContextTimeoutEnabled: true})
	defer ring.Close()
	s := newStore(t, ring, redisstore.Options{})
	if err := s.KeepPresence(context.Background(), time.Second); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("expected errors.ErrUnsupported on a Ring, got %v", err)
	}
}

// count returns how many of the commands logged are name (evalsha and eval
// with any script).
func (l *cmdLog) count(name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.names {
		if c = c[strings.IndexByte(c, ' ')+1:]; c == name || strings.HasPrefix(c, name+"(") {
			n++
		}
	}
	return n
}

// A Locker's idle waiter next in line behind a holder keeps its place by
// its Store's presence alone (one SET per refresh interval, no script), and
// still gets the key when the holder releases.
func TestIdleHeadKeptByPresence(t *testing.T) {
	srv := testredis.Start(t)
	holder := newStore(t, newClient(t, srv.Addr), redisstore.Options{})
	c := newClient(t, srv.Addr)
	cc := &cmdLog{}
	c.AddHook(cc)
	lk, err := leasehold.New(newStore(t, c, redisstore.Options{}), leasehold.Options{TTL: 10 * time.Second, WaiterTTL: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	ctx := t.Context()
	const key = "idle"
	if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := lk.Acquire(ctx, key)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for cc.count("set") < 2 { // queued, and the presence kept twice
		if time.Now().After(deadline) {
			t.Fatal("expected the waiter's presence kept within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(600 * time.Millisecond) // a refresh or more: the place is now kept by the presence
	scripts, sets := cc.count("evalsha")+cc.count("eval"), cc.count("set")
	time.Sleep(2 * time.Second) // ten refresh intervals, under a third of Kept
	scripts, sets = cc.count("evalsha")+cc.count("eval")-scripts, cc.count("set")-sets
	if scripts > 1 || sets < 5 {
		t.Errorf("idle head over 10 refresh intervals: expected the presence kept each interval and at most one script, got %d SETs and %d scripts", sets, scripts)
	}
	if n := waiting(t, holder, key); n != 1 {
		t.Fatalf("expected the idle waiter still queued, got %d waiting", n)
	}
	if err := holder.Release(ctx, key, "h"); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("expected the waiter to get the key on release, got %v", err)
	}
}

// reorderStore holds a waiter's second Acquire, sent before its Locker
// first kept the presence (so without Kept), until a RefreshQueue with Kept
// has kept the same place: the acquire then reaches Redis after the
// refresh, as one on a slower connection or resent by go-redis after a
// lost reply does. Its first Acquire reports the holder's expiry near, so
// that the second comes before the Locker's first round.
type reorderStore struct {
	*redisstore.Store
	mu        sync.Mutex
	acqs      int
	unkept    bool          // the second Acquire was sent without Kept
	second    chan struct{} // closed when the second Acquire answered
	refreshed chan struct{} // closed when a RefreshQueue with Kept kept its places
}

func newReorderStore(s *redisstore.Store) *reorderStore {
	return &reorderStore{Store: s, second: make(chan struct{}), refreshed: make(chan struct{})}
}

func (s *reorderStore) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	s.mu.Lock()
	s.acqs++
	n := s.acqs
	if n == 2 {
		s.unkept = req.Kept == 0
	}
	s.mu.Unlock()
	if n == 2 && req.Kept == 0 {
		select {
		case <-s.refreshed:
		case <-ctx.Done():
		}
	}
	g, err := s.Store.Acquire(ctx, req)
	switch n {
	case 1:
		g.Remaining = min(g.Remaining, 100*time.Millisecond)
	case 2:
		close(s.second)
	}
	return g, err
}

func (s *reorderStore) RefreshQueue(ctx context.Context, reqs []driver.QueueRefresh) []error {
	errs := s.Store.RefreshQueue(ctx, reqs)
	if len(reqs) > 0 && reqs[0].Kept > 0 && errs[0] == nil {
		s.mu.Lock()
		select {
		case <-s.refreshed:
		default:
			close(s.refreshed)
		}
		s.mu.Unlock()
	}
	return errs
}

// reorderedWaiter starts a Locker's waiter on key behind holder's lock
// whose second Acquire, without Kept, lands after a refresh with Kept (see
// reorderStore), and returns the waiter's result once that Acquire
// answered: the place must still be known to last as the Locker thinks.
func reorderedWaiter(t *testing.T, srv *testredis.Server, holder *redisstore.Store, key string, waiterTTL time.Duration) <-chan *leasehold.Lease {
	t.Helper()
	ctx := t.Context()
	rs := newReorderStore(newStore(t, newClient(t, srv.Addr), redisstore.Options{}))
	lk, err := leasehold.New(rs, leasehold.Options{TTL: 10 * time.Second, WaiterTTL: waiterTTL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk.Close() })
	if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	got := make(chan *leasehold.Lease, 1)
	go func() {
		l, _ := lk.Acquire(ctx, key) // nil when the Locker closed first
		got <- l
	}()
	select {
	case <-rs.second:
	case <-time.After(10 * time.Second):
		t.Fatal("expected the waiter's second Acquire within 10s")
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if !rs.unkept {
		t.Skip("the Locker kept its presence before its second Acquire (a loaded machine): nothing to reorder")
	}
	return got
}

// A waiter's Acquire sent without Kept that Redis applies after a refresh
// with Kept must not shorten the place its Locker now counts as kept by
// the presence (refreshed only every Kept/3 next in line): the place must
// outlive WaiterTTL.
func TestPresenceLateUnkeptAcquireKeepsThePlace(t *testing.T) {
	srv := testredis.Start(t)
	holder := newStore(t, newClient(t, srv.Addr), redisstore.Options{})
	const key, waiterTTL = "late-unkept", 600 * time.Millisecond
	reorderedWaiter(t, srv, holder, key, waiterTTL)
	time.Sleep(2 * waiterTTL)
	if n := waiting(t, holder, key); n != 1 {
		t.Fatalf("expected the waiter still queued %v after its last Acquire, got %d waiting", 2*waiterTTL, n)
	}
}

// A hand-off to that waiter is trusted no longer than Redis keeps it.
func TestPresenceLateUnkeptAcquireHandOffIsSafe(t *testing.T) {
	srv := testredis.Start(t)
	c := newClient(t, srv.Addr)
	holder := newStore(t, c, redisstore.Options{})
	const key, waiterTTL = "late-unkept-handoff", 600 * time.Millisecond
	got := reorderedWaiter(t, srv, holder, key, waiterTTL)
	time.Sleep(waiterTTL / 2)
	if err := holder.Release(t.Context(), key, "h"); err != nil {
		t.Fatal(err)
	}
	l := <-got
	if l == nil {
		t.Fatal("expected the waiter to get the key on release")
	}
	expiry := time.Now().Add(c.PTTL(t.Context(), holder.LockKey(key)).Val())
	if over := l.ValidUntil().Sub(expiry); over > 2*time.Millisecond {
		t.Errorf("the hand-off is trusted %v past the lock's expiry in Redis (ValidUntil %v, PTTL expiry %v)", over, l.ValidUntil(), expiry)
	}
}

// At the store: an acquire or refresh without Kept that lands after one
// with Kept leaves the place kept, its deadline where it was.
func TestPresenceUnkeptWriteNeverShortensAKeptPlace(t *testing.T) {
	srv := testredis.Start(t)
	c := newClient(t, srv.Addr)
	holder, waiter := newStore(t, newClient(t, srv.Addr), redisstore.Options{}), newStore(t, c, redisstore.Options{})
	ctx := t.Context()
	const key = "unkept-late"
	if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := waiter.KeepPresence(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	req := driver.AcquireRequest{Key: key, Token: "w", TTL: time.Second, QueueTTL: 100 * time.Millisecond, Kept: time.Minute}
	if _, err := waiter.Acquire(ctx, req); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	kept := c.HGet(ctx, waiter.QueueKey(key), "w").Val()
	req.Kept = 0
	if _, err := waiter.Acquire(ctx, req); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("expected ErrNotAcquired, got %v", err)
	}
	if errs := waiter.RefreshQueue(ctx, []driver.QueueRefresh{{Key: key, Token: "w", QueueTTL: req.QueueTTL}}); errs[0] != nil {
		t.Fatalf("RefreshQueue: %v", errs[0])
	}
	if v := c.HGet(ctx, waiter.QueueKey(key), "w").Val(); v != kept {
		t.Errorf("expected the kept place %q left as it was, got %q", kept, v)
	}
	time.Sleep(3 * req.QueueTTL)
	if n := waiting(t, holder, key); n != 1 {
		t.Errorf("expected the kept place to outlive QueueTTL, got %d waiting", n)
	}
}

// After Redis lost every key (a restart without persistence, FLUSHALL),
// the waiters that re-check at the reconnect of their notifications queue
// again before their Lockers' next rounds keep the presences again: their
// places must be live at once, or each re-queued waiter drops the one
// before it and believes itself next in line for Kept/3.
func TestPresenceLostWaitersQueueAgain(t *testing.T) {
	srv := testredis.Start(t)
	admin := newClient(t, srv.Addr)
	holder := newStore(t, newClient(t, srv.Addr), redisstore.Options{})
	ctx := t.Context()
	const key, waiterTTL, n = "lost", 900 * time.Millisecond, 3
	if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for range n { // n processes
		lk, err := leasehold.New(newStore(t, newClient(t, srv.Addr), redisstore.Options{}), leasehold.Options{TTL: 10 * time.Second, WaiterTTL: waiterTTL})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lk.Close() })
		go func() { _, _ = lk.Acquire(ctx, key) }()
	}
	deadline := time.Now().Add(10 * time.Second)
	for waiting(t, holder, key) != n {
		if time.Now().After(deadline) {
			t.Fatalf("expected %d waiters queued within 10s", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(waiterTTL) // the presences kept: the places are kept by them
	if err := admin.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(waiterTTL) // the waiters re-check, and each Locker keeps its presence again
	if got := waiting(t, holder, key); got != n {
		t.Fatalf("expected the %d waiters queued again, got %d", n, got)
	}
}

// slowWakeStore hands its Locker a grant (a Wake with a fence) only after
// the next KeepPresence that succeeded after the grant came: a wake-up
// read a little late, after the Locker's keeper kept the presence again.
type slowWakeStore struct {
	*redisstore.Store
	keeps atomic.Int64 // KeepPresence calls that succeeded
}

func (s *slowWakeStore) KeepPresence(ctx context.Context, ttl time.Duration) error {
	err := s.Store.KeepPresence(ctx, ttl)
	if err == nil {
		s.keeps.Add(1)
	}
	return err
}

func (s *slowWakeStore) WaitRelease(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	in, stop, err := s.Store.WaitRelease(ctx, key, token)
	if err != nil {
		return nil, nil, err
	}
	out := make(chan driver.Wake, 1)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case w := <-in:
				if w.Fence != 0 {
					for n := s.keeps.Load(); s.keeps.Load() == n; {
						time.Sleep(time.Millisecond)
					}
				}
				select {
				case out <- w:
				default:
				}
			case <-done:
				return
			}
		}
	}()
	return out, func() { close(done); stop() }, nil
}

// A hand-off to a place kept by the presence is capped at what was left of
// the presence when Redis granted it: a presence kept after that grant
// (before the waiter read the wake-up) does not extend the lock, so the
// lease must not count on it.
func TestPresenceHandOffIgnoresALaterKeep(t *testing.T) {
	srv := testredis.Start(t)
	c := newClient(t, srv.Addr)
	holder := newStore(t, c, redisstore.Options{})
	ctx := t.Context()
	const key, waiterTTL = "later-keep", 600 * time.Millisecond
	if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	lk, err := leasehold.New(&slowWakeStore{Store: newStore(t, newClient(t, srv.Addr), redisstore.Options{})},
		leasehold.Options{TTL: 10 * time.Second, WaiterTTL: waiterTTL})
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	got := make(chan *leasehold.Lease, 1)
	go func() {
		l, _ := lk.Acquire(ctx, key)
		got <- l
	}()
	time.Sleep(2 * waiterTTL) // queued, and kept by the presence
	if err := holder.Release(ctx, key, "h"); err != nil {
		t.Fatal(err)
	}
	l := <-got
	if l == nil {
		t.Fatal("expected the waiter to get the key on release")
	}
	expiry := time.Now().Add(c.PTTL(ctx, holder.LockKey(key)).Val())
	if over := l.ValidUntil().Sub(expiry); over > 2*time.Millisecond {
		t.Errorf("the hand-off is trusted %v past the lock's expiry in Redis (ValidUntil %v, PTTL expiry %v)", over, l.ValidUntil(), expiry)
	}
}

// failingPresence is a Store whose KeepPresence fails while fail is set.
type failingPresence struct {
	*redisstore.Store
	fail   atomic.Bool
	places atomic.Int64 // places sent in RefreshQueue calls
}

func (f *failingPresence) KeepPresence(ctx context.Context, ttl time.Duration) error {
	if f.fail.Load() {
		return fmt.Errorf("%w: injected", driver.ErrUnavailable)
	}
	return f.Store.KeepPresence(ctx, ttl)
}

func (f *failingPresence) RefreshQueue(ctx context.Context, reqs []driver.QueueRefresh) []error {
	f.places.Add(int64(len(reqs)))
	return f.Store.RefreshQueue(ctx, reqs)
}

// While its presence cannot be kept, an idle head's place is refreshed
// every round again, so it does not silently die with the presence (it was
// left alone for Kept/3), and the waiter keeps its place.
func TestIdleHeadRefreshedWhenThePresenceFails(t *testing.T) {
	srv := testredis.Start(t)
	holder := newStore(t, newClient(t, srv.Addr), redisstore.Options{})
	fs := &failingPresence{Store: newStore(t, newClient(t, srv.Addr), redisstore.Options{})}
	const wttl = 600 * time.Millisecond
	lk, err := leasehold.New(fs, leasehold.Options{TTL: 10 * time.Second, WaiterTTL: wttl})
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	ctx := t.Context()
	const key = "presence-fails"
	if _, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "h", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := lk.Acquire(wctx, key); done <- err }()
	defer func() { cancel(); <-done }()
	time.Sleep(4 * wttl / 3) // queued, the presence kept, the place moved to it
	before := fs.places.Load()
	time.Sleep(wttl) // three rounds: an idle head is not refreshed (Kept/3 = 4 s)
	if n := fs.places.Load() - before; n != 0 {
		t.Fatalf("expected the idle head left alone while the presence is kept, got %d place refreshes", n)
	}
	fs.fail.Store(true)
	time.Sleep(3 * wttl) // the presence lapses in Redis
	if n := fs.places.Load() - before; n < 2 {
		t.Errorf("expected the idle head refreshed each round while the presence fails, got %d place refreshes", n)
	}
	if n := waiting(t, holder, key); n != 1 {
		t.Errorf("expected the waiter still queued after its presence lapsed, got %d waiting", n)
	}
}
