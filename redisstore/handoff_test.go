package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
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

// replica is one process's view: its own client (with a command counter),
// Store and Locker.
type replica struct {
	cmds atomic.Int64
	s    *redisstore.Store
	lk   *leasehold.Locker
	log  cmdLog // what the counted commands were, for failure messages
}

// cmdLog records the names of the commands a client sent, in order.
type cmdLog struct {
	mu    sync.Mutex
	names []string
}

func (l *cmdLog) DialHook(next redis.DialHook) redis.DialHook { return next }
func (l *cmdLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		l.add(cmd)
		return next(ctx, cmd)
	}
}
func (l *cmdLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		l.add(cmds...)
		return next(ctx, cmds)
	}
}

func (l *cmdLog) add(cmds ...redis.Cmder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range cmds {
		name := c.Name()
		if len(c.Args()) > 1 && (name == "evalsha" || name == "eval") {
			name += fmt.Sprintf("(%.8v)", c.Args()[1])
		}
		l.names = append(l.names, time.Now().Format("15:04:05.000 ")+name)
	}
}

// since returns the names logged after the first n.
func (l *cmdLog) since(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.names[min(n, len(l.names)):])
}

func (l *cmdLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.names)
}

func newReplica(t *testing.T, srv *testredis.Server, opts leasehold.Options) *replica {
	t.Helper()
	r := &replica{}
	c := srv.Client(t)
	c.AddHook(countHook{&r.cmds})
	c.AddHook(&r.log)
	s, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	opts.WaitCap = time.Minute // a missed wake-up would stall the test, not hide in polling
	lk, err := leasehold.New(s, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk.Close() })
	r.s, r.lk = s, lk
	return r
}

// waitQueued waits until key has n waiters and r's command count has been
// still for 100 ms (r sent its queued acquire and subscribed), and returns
// that count.
func waitQueued(t *testing.T, r *replica, key string, n int) int64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	last := int64(-1)
	for time.Now().Before(deadline) {
		info, err := r.s.Inspect(t.Context(), key)
		cur := r.cmds.Load() - 1 // minus this Inspect
		r.cmds.Add(-1)
		if err == nil && info.Waiting == n && cur == last {
			return cur
		}
		last = cur
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%q: expected %d waiter(s) queued within 10s", key, n)
	return 0
}

type acquired struct {
	ls  *leasehold.Lease
	err error
}

func acquireAsync(ctx context.Context, lk *leasehold.Locker, key string) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		ls, err := lk.Acquire(ctx, key)
		ch <- acquired{ls, err}
	}()
	return ch
}

// TestHandOffSendsNoAcquire checks issue 11's hand-off in one round trip: a
// release grants the key to the head waiter, which takes its lease from the
// notification without sending anything. Before grant-on-release the woken
// waiter sent an acquire of its own.
func TestHandOffSendsNoAcquire(t *testing.T) {
	srv := testredis.Start(t)
	opts := leasehold.Options{TTL: 10 * time.Second, WaiterTTL: time.Minute} // no queue refresh during the test
	a, b := newReplica(t, srv, opts), newReplica(t, srv, opts)
	ctx := t.Context()
	const key = "handoff:none"
	held, err := a.lk.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(ctx, b.lk, key)
	before := waitQueued(t, b, key, 1)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter after the release: %v", r.err)
	}
	if sent := b.cmds.Load() - before; sent != 0 {
		t.Errorf("the granted waiter sent %d command(s) after the release, expected none (the grant came with the wake-up)", sent)
	}
	info, err := a.s.Inspect(ctx, key)
	if err != nil || info.Token != r.ls.Token() || info.Fence != r.ls.Fence() || r.ls.Fence() <= held.Fence() {
		t.Fatalf("after the hand-off: expected the waiter's token and fence %d (> %d) in Redis, got %+v, %v", r.ls.Fence(), held.Fence(), info, err)
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestHandOffLongTTLRenewsEarly checks that a grant capped at the waiter's
// queue deadline (TTL > WaiterTTL) is taken without another acquire: the
// lease is trusted until the cap (Redis's PX is at most WaiterTTL), and its
// first renewal, due within a third of the cap, extends the lock to the
// full TTL with the grant's fence.
func TestHandOffLongTTLRenewsEarly(t *testing.T) {
	srv := testredis.Start(t)
	const waiterTTL = 3 * time.Second
	opts := leasehold.Options{TTL: time.Minute, WaiterTTL: waiterTTL}
	a, b := newReplica(t, srv, opts), newReplica(t, srv, opts)
	ctx := t.Context()
	const key = "handoff:long"
	held, err := a.lk.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(ctx, b.lk, key)
	waitQueued(t, b, key, 1)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter after the release: %v", r.err)
	}
	info, err := a.s.Inspect(ctx, key)
	if err != nil || info.Fence != r.ls.Fence() || info.Remaining > waiterTTL {
		t.Fatalf("after a capped grant: expected fence %d and the grant's TTL (at most the %v queue deadline: no acquire sent), got %+v, %v", r.ls.Fence(), waiterTTL, info, err)
	}
	if until := time.Until(r.ls.ValidUntil()); until > waiterTTL {
		t.Fatalf("a capped grant must be trusted for WaiterTTL at most before its first renewal, got %v", until)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err = a.s.Inspect(ctx, key)
		if err == nil && info.Remaining > waiterTTL {
			break
		}
		if time.Now().After(deadline) || r.ls.Err() != nil {
			t.Fatalf("expected the first renewal to extend the capped grant to the full TTL, got %+v, %v (lease: %v)", info, err, r.ls.Err())
		}
	}
	if info.Fence != r.ls.Fence() || time.Until(r.ls.ValidUntil()) <= waiterTTL {
		t.Fatalf("after the first renewal: expected fence %d and the lease trusted for the TTL, got %+v, valid for %v", r.ls.Fence(), info, time.Until(r.ls.ValidUntil()))
	}
	if err := r.ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLoopingWaiterKeepsItsSubscription checks that a replica waiting on
// one key again and again subscribes the key's channel once (it lingers
// between waits), and then needs only its queued acquire and its release
// per turn: no re-check after subscribing.
func TestLoopingWaiterKeepsItsSubscription(t *testing.T) {
	srv := testredis.Start(t)
	admin := srv.Client(t)
	opts := leasehold.Options{TTL: 10 * time.Second, WaiterTTL: time.Minute}
	a, b := newReplica(t, srv, opts), newReplica(t, srv, opts)
	ctx := t.Context()
	const key = "handoff:loop"
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const turns = 4
	for turn := range turns {
		held, err := a.lk.Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		start, logged := b.cmds.Load(), b.log.len()
		got := acquireAsync(ctx, b.lk, key)
		waitQueued(t, b, key, 1)
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-got
		if r.err != nil {
			t.Fatalf("turn %d: %v", turn, r.err)
		}
		if err := r.ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
		// That release published "" (nobody queued): let it arrive before the
		// next turn's waiter subscribes, which it would wake for nothing.
		time.Sleep(200 * time.Millisecond)
		// waitQueued's Inspects are not counted.
		if sent := b.cmds.Load() - start; turn > 0 && sent != 2 {
			t.Errorf("turn %d: the waiter sent %d commands for one contended acquisition and its release, expected 2 (the queued acquire and the release); sent (waitQueued's Inspects included): %q", turn, sent, b.log.since(logged))
		}
	}
	if n := subscribeCalls(t, admin); n != 1 {
		t.Errorf("%d turns of one waiter on one key: expected 1 SUBSCRIBE (of the key's channel and the process's together, once: they linger between waits), Redis counted %d", turns, n)
	}
}

// subscribeCalls returns Redis's count of SUBSCRIBE calls since the last
// CONFIG RESETSTAT.
func subscribeCalls(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_subscribe:calls="); ok {
			n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
			return n
		}
	}
	return 0
}

// TestGrantReachesOnlyTheHeadsProcess checks that a hand-off is published
// to the head's process alone (its WaiterChannel) and to observers, not on
// the key's channel that every waiting process subscribes: on a busy host
// every process woken for nothing delays the one that was granted.
func TestGrantReachesOnlyTheHeadsProcess(t *testing.T) {
	srv := testredis.Start(t)
	opts := leasehold.Options{TTL: 10 * time.Second, WaiterTTL: time.Minute}
	a, b := newReplica(t, srv, opts), newReplica(t, srv, opts)
	ctx := t.Context()
	const key = "handoff:fanout"
	spy := srv.Client(t).Subscribe(ctx, a.s.Channel(key), b.s.WaiterChannel(key), a.s.ObserverChannel(key))
	defer spy.Close()
	for range 3 {
		if _, err := spy.Receive(ctx); err != nil {
			t.Fatal(err)
		}
	}
	held, err := a.lk.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(ctx, b.lk, key)
	waitQueued(t, b, key, 1)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	want := map[string]bool{b.s.WaiterChannel(key): true, a.s.ObserverChannel(key): true}
	for range 2 {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m, err := spy.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			t.Fatalf("expected the grant on %v: %v", want, err)
		}
		if !want[m.Channel] || !strings.HasPrefix(m.Payload, r.ls.Token()+"|") {
			t.Fatalf("hand-off published %q on %s; expected the grant to %s on the head's process channel and the observer channel only", m.Payload, m.Channel, r.ls.Token())
		}
		delete(want, m.Channel)
	}
	if err := r.ls.Release(ctx); err != nil { // nobody queued: "" on the key's channel and the observers'
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if m, err := spy.ReceiveMessage(rctx); err != nil || m.Channel != a.s.Channel(key) || m.Payload != "" {
		t.Fatalf("release with nobody queued: expected \"\" on %s first, got %+v, %v", a.s.Channel(key), m, err)
	}
}

// TestCloseLeavesNoSubscription: a waiter's channels linger after it stops
// waiting, and Close must end them even though the client stays open (the
// client is the application's, and may outlive the Store).
func TestCloseLeavesNoSubscription(t *testing.T) {
	srv := testredis.Start(t)
	c := newClient(t, srv.Addr)
	s, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	_, stop, err := s.WaitRelease(ctx, "close-sub", "tok")
	if err != nil {
		t.Fatal(err)
	}
	stop() // the channels now linger
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Redis drops a closed connection's subscriptions when it reads the
	// close, which may come after this client's next command: allow 2 s.
	for _, ch := range []string{s.Channel("close-sub"), s.WaiterChannel("close-sub")} {
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			n, err := c.PubSubNumSub(ctx, ch).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n[ch] == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("2s after Close: %s has %d subscribers, expected 0", ch, n[ch])
				break
			}
		}
	}
}

// The Locker, not the Store, releases what it holds: a lock a release
// handed to a Locker's waiting Acquire (Granted), then renewed, is released
// by the Locker's Close. The Store's Close releases nothing: a lock taken
// through the Store alone stays until its TTL.
func TestLockerCloseReleasesAHandedOffLease(t *testing.T) {
	srv := testredis.Start(t)
	a := newStore(t, newClient(t, srv.Addr), redisstore.Options{})
	b := newStore(t, newClient(t, srv.Addr), redisstore.Options{})
	ctx := t.Context()
	const key = "close:granted"
	if _, err := a.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	lk, err := leasehold.New(b, leasehold.Options{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	got := make(chan *leasehold.Lease, 1)
	go func() {
		ls, err := lk.Acquire(ctx, key)
		if err != nil {
			t.Errorf("waiting Acquire: %v", err)
		}
		got <- ls
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if info, err := a.Inspect(ctx, key); err == nil && info.Waiting == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Locker's Acquire did not queue within 5s")
		}
	}
	if err := a.Release(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	var ls *leasehold.Lease
	select {
	case ls = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no lease 5s after the release")
	}
	if ls == nil {
		return
	}
	if err := ls.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lk.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Inspect(ctx, key); !errors.Is(err, leasehold.ErrNotHeld) {
		t.Fatalf("after Close of the Locker that was handed the key: expected ErrNotHeld, got %v", err)
	}

	if _, err := b.Acquire(ctx, driver.AcquireRequest{Key: "close:store", Token: "b", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if info, err := a.Inspect(ctx, "close:store"); err != nil || info.Token != "b" {
		t.Fatalf("after the Store's Close: expected its lock left to its TTL, got %+v, %v", info, err)
	}
}

// TestWaitersBehindAHolderSendOneScriptEach checks issue 33 item 4's
// cost per acquisition with many Lockers: n waiters, each its own
// process (client, Store, Locker) with no subscription yet, queue behind a
// holder, and the releases hand the key down the queue. Each waiter
// sends one acquire script (its queued acquire) and one release script,
// whatever n: the subscription's check that it missed no release is a GET
// of the lock (a waiter behind another holder is woken by the next
// release), not a second acquire script, which also walks the whole queue.
func TestWaitersBehindAHolderSendOneScriptEach(t *testing.T) {
	srv := testredis.Start(t)
	opts := leasehold.Options{TTL: 10 * time.Second, WaiterTTL: time.Minute} // no queue refresh during the test
	const n = 6
	a := newReplica(t, srv, opts)
	admin := newStore(t, newClient(t, srv.Addr), redisstore.Options{}) // Inspects, apart from the waiters' logs
	ws := make([]*replica, n)
	for i := range ws {
		ws[i] = newReplica(t, srv, opts)
	}
	ctx := t.Context()
	const key = "handoff:many"
	held, err := a.lk.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, n)
	for i, w := range ws {
		go func() {
			ls, err := w.lk.Acquire(ctx, key)
			if err == nil {
				err = ls.Release(ctx)
			}
			done <- err
		}()
		// In order, each subscribed behind a holder before the next queues.
		for start := w.cmds.Load(); ; {
			time.Sleep(100 * time.Millisecond)
			info, err := admin.Inspect(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if cur := w.cmds.Load(); info.Waiting == i+1 && cur == start {
				break
			} else {
				start = cur
			}
		}
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for i, w := range ws {
		var scripts []string
		for _, name := range w.log.since(0) {
			if strings.Contains(name, " eval") {
				scripts = append(scripts, name)
			}
		}
		if len(scripts) != 2 {
			t.Errorf("waiter %d: %d scripts for one contended acquisition and its release, expected 2 (the queued acquire and the release): %q", i, len(scripts), w.log.since(0))
		}
	}
}
