package etcdstore

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"time"

	"github.com/leasehold/leasehold/driver"
	"github.com/leasehold/leasehold/internal/waiters"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

const (
	// watchStartTimeout is the least a key's watch may take to start: the
	// client creates a stream's watches one at a time, so thousands of new
	// keys queue behind each other with no outage (a waiter whose start
	// failed would poll etcd with a write per refresh).
	watchStartTimeout = 5 * time.Second
	// watchLinger is how long a key's watch outlives its last subscriber,
	// so that a replica that waits again soon (a busy key) reuses it.
	watchLinger = 2 * time.Second
)

// WaitRelease implements driver.Notifier with one etcd watch per key,
// shared by its subscribers and kept watchLinger after the last one leaves,
// started at etcd's current revision with the key's state as of then (the
// waiter's last Acquire answer, or a read), so no change after the Acquire
// is missed: a key freed or granted to token meanwhile wakes it at once.
//
// The channel (never closed) gets a value each time token may take the key
// (the lock free, the queue empty or headed by token), when a release granted
// it the key (the Wake carries the grant), when it heads the queue of a lock unchanged for its
// TTL (the takeover), and when the watch breaks. An empty token subscribes an
// observer, woken whenever the lock becomes free or changes holder.
// WaitRelease returns once etcd confirmed the watch, bounded by ctx and
// startTimeout. stop, idempotent, or the end of ctx ends the subscription.
// No wake-up at once unless the key may be taken now or is token's.
func (s *Store) WaitRelease(ctx context.Context, key, token string) (<-chan driver.Wake, func(), error) {
	if err := checkNames(key, cmp.Or(token, "observer"), ""); err != nil {
		return nil, nil, err
	}
	if s.sess.closed() {
		return nil, nil, ErrClosed
	}
	sb := &subscriber{r: ref{key, token}, entry: s.entryKey(key, token), wake: make(chan driver.Wake, 1)}
	kw := s.watches.join(s, key, sb, s.sess.snapshot(ref{key, token}))
	start := s.startTimeout()
	tctx, cancel := context.WithTimeoutCause(ctx, start,
		fmt.Errorf("%w: etcd did not confirm the watch within %v", ErrUnavailable, start))
	defer cancel()
	var err error
	select {
	case <-kw.ready:
		err = kw.err
	case <-tctx.Done():
		err = context.Cause(tctx)
	}
	if err != nil {
		s.watches.leave(kw, sb)
		return nil, nil, fmt.Errorf("etcdstore: watch %q: %w", key, err)
	}
	s.watches.mu.Lock()
	sb.was = kw.can(sb)
	if sb.was {
		sb.signal() // it may take the key now
	} else if token != "" && ownedBy(kw.lock, token) {
		waiters.Send(sb.wake, kw.handoff(sb.r, kw.lock)) // granted before the watch started
	}
	s.watches.mu.Unlock()
	leave := sync.OnceFunc(func() { s.watches.leave(kw, sb) })
	unhook := context.AfterFunc(ctx, leave) // the subscription ends with ctx too
	return sb.wake, func() { unhook(); leave() }, nil
}

// watchStreams is how many gRPC watch streams the key watches are spread
// over (by their ctx metadata, as clientv3 groups them): clientv3 creates a
// stream's watches one at a time, each waiting for etcd's confirmation, so
// 10,000 keys on one stream took tens of seconds to be watched.
const watchStreams = 16

// startTimeout bounds a watch's start: RequestTimeout, at least watchStartTimeout.
func (s *Store) startTimeout() time.Duration {
	return max(s.timeout, watchStartTimeout)
}

// watches are the store's key watches.
type watches struct {
	mu     sync.Mutex
	keys   map[string]*keyWatch
	wg     sync.WaitGroup // one per keyWatch goroutine
	closed bool           // no new keyWatch: the store is closing
}

// close stops new key watches and waits for the running ones, which end
// with the session's context.
func (w *watches) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.wg.Wait()
}

// keyWatch is the watch of one key and the model it maintains.
type keyWatch struct {
	s     *Store
	key   string
	ready chan struct{} // closed when the watch started or failed (err)
	err   error
	// Under watches.mu: the model (events at or before its rev are in it;
	// no token), and when the watch first saw the held lock at its mod
	// revision: the head is woken at lockAt plus its TTL (takeover).
	keyView
	lockAt time.Time
	subs   map[*subscriber]struct{}
	empty  time.Time // when subs became empty

	emptied chan struct{} // capacity 1: subs became empty
}

// subscriber is one WaitRelease.
type subscriber struct {
	r     ref
	entry string // the token's queue entry key
	wake  chan driver.Wake
	was   bool // could take the key at the last check
}

// observer reports a subscriber without a token (see WaitRelease).
func (sb *subscriber) observer() bool { return sb.r.token == "" }

func (sb *subscriber) signal() { waiters.Send(sb.wake, driver.Wake{}) }

// join adds sb to key's watch, starting it (seeded with snap, when known).
func (w *watches) join(s *Store, key string, sb *subscriber, snap *keyView) *keyWatch {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.keys == nil {
		w.keys = map[string]*keyWatch{}
	}
	kw := w.keys[key]
	if w.closed {
		kw = &keyWatch{s: s, key: key, ready: make(chan struct{}), subs: map[*subscriber]struct{}{}, err: ErrClosed}
		close(kw.ready)
	} else if kw == nil {
		kw = &keyWatch{s: s, key: key, ready: make(chan struct{}), subs: map[*subscriber]struct{}{}, emptied: make(chan struct{}, 1)}
		w.keys[key] = kw
		w.wg.Go(func() { kw.run(snap) })
	}
	kw.subs[sb] = struct{}{}
	return kw
}

func (w *watches) leave(kw *keyWatch, sb *subscriber) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(kw.subs, sb)
	if len(kw.subs) == 0 {
		kw.empty = time.Now()
		select {
		case kw.emptied <- struct{}{}:
		default:
		}
	}
}

// can reports whether sb may take the key in the model; watches.mu is held.
func (kw *keyWatch) can(sb *subscriber) bool {
	return kw.lock == nil && (sb.observer() || len(kw.entries) == 0 || kw.heads(sb))
}

// heads reports whether sb's entry heads the queue; watches.mu is held.
func (kw *keyWatch) heads(sb *subscriber) bool {
	return string(kw.oldest("").GetKey()) == sb.entry // sb.entry is never ""
}

// run is the key watch's goroutine: it starts the watch (its model from
// snap, or a read), follows it, restarts it after a break, and ends when the store
// closes or nobody subscribed for watchLinger.
func (kw *keyWatch) run(snap *keyView) {
	ctx := kw.s.sess.ctx
	for first := true; ; first = false {
		wch, cancel, err := kw.start(ctx, snap)
		snap = nil
		if first {
			kw.err = err
			close(kw.ready)
		}
		if err != nil {
			if first || ctx.Err() != nil {
				kw.remove(false)
				return
			}
			kw.signal(nil)
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		done := kw.follow(ctx, wch)
		cancel()
		drain(wch)
		if done {
			return
		}
		kw.signal(nil) // the watch broke: every waiter re-checks
	}
}

// subscribed reports whether kw has a subscriber.
func (kw *keyWatch) subscribed() bool {
	w := &kw.s.watches
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(kw.subs) > 0
}

// remove takes kw out of the store's watches; idle: only when nobody
// subscribed for watchLinger. It reports whether it did.
func (kw *keyWatch) remove(idle bool) bool {
	w := &kw.s.watches
	w.mu.Lock()
	defer w.mu.Unlock()
	if idle && (len(kw.subs) > 0 || time.Since(kw.empty) < watchLinger) {
		return false
	}
	if w.keys[kw.key] == kw {
		delete(w.keys, kw.key)
	}
	return true
}

// signal signals, under watches.mu, the subscribers f holds for (nil: all).
func (kw *keyWatch) signal(f func(*subscriber) bool) {
	w := &kw.s.watches
	w.mu.Lock()
	defer w.mu.Unlock()
	for sb := range kw.subs {
		if f == nil || f(sb) {
			sb.signal()
		}
	}
}

// start starts the watch from etcd's current revision (one from a past
// revision is "unsynced", slow to catch up: docs/etcd.md) and loads the
// model as of that revision or later: from snap when it is that recent, else
// from one read at the watch's revision. Events at or before the model's
// revision are then skipped.
func (kw *keyWatch) start(ctx context.Context, snap *keyView) (clientv3.WatchChan, context.CancelFunc, error) {
	bctx, bcancel := context.WithTimeoutCause(ctx, kw.s.startTimeout(), errTimeout)
	defer bcancel()
	ks, ke := kw.s.keyRange(kw.key)
	h := fnv.New32a() // the key's watch stream
	_, _ = h.Write([]byte(kw.key))
	stream := strconv.Itoa(int(h.Sum32() % watchStreams))
	wctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "leasehold-watch-stream", stream))
	wch := kw.s.cli.Watch(wctx, ks, clientv3.WithRange(ke), clientv3.WithCreatedNotify())
	fail := func(err error) (clientv3.WatchChan, context.CancelFunc, error) {
		cancel()
		drain(wch)
		return nil, nil, kw.s.wrap(bctx, "watch", kw.key, err)
	}
	select {
	case wr, ok := <-wch:
		if !ok || !wr.Created || wr.Err() != nil {
			cancel() // wctx's cause, when the watch gave no error
			return fail(cmp.Or(wr.Err(), context.Cause(wctx)))
		}
		if snap == nil || snap.rev < wr.Header.Revision {
			get, err := kw.s.cli.Get(bctx, ks, clientv3.WithRange(ke), clientv3.WithRev(wr.Header.Revision))
			if err != nil {
				return fail(err)
			}
			v := kw.s.view(kw.key, "", get.Kvs, wr.Header.Revision)
			snap = &v
		}
	case <-bctx.Done():
		return fail(fmt.Errorf("%w: etcd did not confirm the watch: %w", ErrUnavailable, context.Cause(bctx)))
	}
	w := &kw.s.watches
	w.mu.Lock()
	kw.keyView, kw.lockAt = *snap, time.Now()
	w.mu.Unlock()
	return wch, cancel, nil
}

// follow applies watch events to the model and signals each subscriber that
// became able to take the key. It returns true when the watch goroutine is
// done (the store closed, or nobody subscribed for watchLinger; kw is then
// removed), false when the watch broke.
func (kw *keyWatch) follow(ctx context.Context, wch clientv3.WatchChan) bool {
	// Armed while nobody subscribes: no timer per idle waiter's watch.
	idle := time.NewTimer(watchLinger)
	defer idle.Stop()
	if kw.subscribed() {
		idle.Stop()
	}
	expiry := time.NewTimer(time.Hour)
	defer expiry.Stop()
	kw.arm(expiry)
	for {
		select {
		case <-ctx.Done():
			kw.remove(false)
			return true
		case <-kw.emptied:
			idle.Reset(watchLinger)
		case <-idle.C:
			if kw.remove(true) {
				return true
			}
		case <-expiry.C:
			kw.signal(func(sb *subscriber) bool { return kw.lock != nil && kw.heads(sb) }) // the takeover
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				return false
			}
			kw.apply(wr.Events)
			kw.arm(expiry)
		}
	}
}

// arm sets the expiry timer t to wake a subscribed head of the queue for
// the takeover, takeoverEarly before the held lock's TTL, or stops it.
func (kw *keyWatch) arm(t *time.Timer) {
	w := &kw.s.watches
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Stop()
	_, ttl, _, _, _ := lockFields(kw.lock.GetValue()) // 0: free
	for sb := range kw.subs {
		if ttl > 0 && kw.heads(sb) {
			t.Reset(time.Until(kw.lockAt.Add(ttl - takeoverEarly)))
			return
		}
	}
}

// apply applies watch events to the model and, under watches.mu (the
// session's lock is taken inside it, never the other way round), hands each
// waiter a grant naming it, signals the subscribers that became able to take
// the key, and tells the session (sawLock) of the lock write waiters saw.
func (kw *keyWatch) apply(evs []*clientv3.Event) {
	w := &kw.s.watches
	w.mu.Lock()
	defer w.mu.Unlock()
	lockKey := kw.s.lockKey(kw.key)
	var grants []*mvccpb.KeyValue // lock writes, each maybe a grant to a subscriber
	var mod int64                 // the lock written by these events, if it is still there
	for _, ev := range evs {
		if ev.Kv.ModRevision <= kw.rev {
			continue // in the model already
		}
		k := string(ev.Kv.Key)
		switch {
		case k == lockKey:
			was := kw.lock
			kw.lock, mod = nil, 0
			if ev.Type == mvccpb.PUT {
				kw.lock, kw.lockAt, mod = ev.Kv, time.Now(), ev.Kv.ModRevision
				grants = append(grants, ev.Kv)
				kw.newHolder(was, ev.Kv)
			}
		case ev.Type == mvccpb.DELETE:
			delete(kw.entries, k)
		default:
			kw.entries[k] = ev.Kv
		}
	}
	for _, kv := range grants { // after every event: the queue is the one after the grant
		for sb := range kw.subs {
			if !sb.observer() && ownedBy(kv, sb.r.token) {
				waiters.Send(sb.wake, kw.handoff(sb.r, kv))
			}
		}
	}
	_, ttl, _, _, _ := lockFields(kw.lock.GetValue())
	for sb := range kw.subs {
		now := kw.can(sb)
		if now && !sb.was {
			sb.signal()
		}
		sb.was = now
		if e := kw.entries[sb.entry].GetCreateRevision(); e > 0 && e < mod {
			kw.s.sess.sawLock(sb.r, e, mod, kw.lockAt, ttl)
		}
	}
}

// handoff returns the Wake for the grant kv to r, and records the grant in
// the session (with the next head, for r's release); zero when the session
// does not know r's wait (it then acquires, and finds itself the holder).
func (kw *keyWatch) handoff(r ref, kv *mvccpb.KeyValue) driver.Wake {
	s := kw.s
	_, ttl, _, _, _ := lockFields(kv.Value)
	if ttl <= 0 {
		return driver.Wake{}
	}
	var next *headEntry
	if kv := kw.oldest(s.entryKey(r.key, r.token)); kv != nil {
		next = s.entryHead(r.key, kv)
	}
	req, ok := s.sess.granted(r, ttl, kv.ModRevision, int64(fenceOf(kv)), next, s.sess.leases.isPresence(clientv3.LeaseID(kv.Lease)))
	if !ok {
		return driver.Wake{}
	}
	return driver.Wake{Fence: fenceOf(kv), TTL: req.Truncate(time.Millisecond)}
}

// newHolder wakes the observers when lock kv names another holder than was
// (nil when it was free); watches.mu is held.
func (kw *keyWatch) newHolder(was, kv *mvccpb.KeyValue) {
	if tok, _, _, _, _ := lockFields(kv.Value); ownedBy(was, tok) {
		return
	}
	for sb := range kw.subs {
		if sb.observer() {
			sb.signal()
		}
	}
}

// oldest returns the oldest queue entry but skip, nil if none; watches.mu is held.
func (kw *keyWatch) oldest(skip string) *mvccpb.KeyValue {
	var head *mvccpb.KeyValue
	for k, kv := range kw.entries {
		if k != skip && (head == nil || kv.CreateRevision < head.CreateRevision) {
			head = kv
		}
	}
	return head
}

// Live implements driver.LiveNotifier: whether key's watch runs in this store
// (WaitRelease then returns without a round trip).
func (s *Store) Live(key string) bool {
	w := &s.watches
	w.mu.Lock()
	defer w.mu.Unlock()
	if kw := w.keys[key]; kw != nil {
		select {
		case <-kw.ready:
			return kw.err == nil
		default:
		}
	}
	return false
}

// drain empties a cancelled or failed watch channel until the client closes it.
func drain(wch clientv3.WatchChan) {
	for range wch {
	}
}
