package etcdstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// watchStartTimeout bounds how long WaitRelease waits for etcd to confirm
// the watch when RequestTimeout is negative.
const watchStartTimeout = 5 * time.Second

// WaitRelease implements leasehold.Notifier with one etcd watch on the range
// of key's lock and queue entries, from the revision of token's last Acquire
// answer (or of one read, when this store has none), so no change after that
// answer is missed.
//
// The channel (never closed) gets a value each time token may take the key:
// the lock is free (released, or expired: both delete it) and the queue is
// empty or token's entry is its oldest. So a release wakes only the head of
// the queue, and a waiter behind it sleeps until its predecessors got the
// key or left; a token that left the queue (or never joined it) is woken
// only when nobody is queued.
// The channel also gets a value when the watch breaks (its revision was
// compacted): the waiter tries again, and the watch restarts. The client
// resumes a watch on another member when the one it used fails, without
// losing events.
//
// WaitRelease returns once etcd confirmed the watch, bounded by ctx and
// RequestTimeout. stop cancels the watch and waits for its goroutine; call
// it exactly once (later calls do nothing).
func (s *Store) WaitRelease(ctx context.Context, key, token string) (<-chan struct{}, func(), error) {
	if err := checkNames(key, token, ""); err != nil {
		return nil, nil, err
	}
	if s.sess.closed() {
		return nil, nil, ErrClosed
	}
	w := &waiter{s: s, key: key, token: token, wake: make(chan struct{}, 1)}
	wctx, cancel := context.WithCancel(ctx)
	wch, err := w.subscribe(ctx, wctx)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.loop(wctx, wch)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	return w.wake, stop, nil
}

// waiter is one WaitRelease subscription.
type waiter struct {
	s          *Store
	key, token string
	wake       chan struct{}
	snap       *queueSnap
	// cancelWatch ends the current watch (the loop's wctx ends them all).
	cancelWatch context.CancelFunc
}

func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// subscribe takes the queue snapshot (the last Acquire's, or one read) and
// starts the watch after it; it waits for etcd's confirmation, bounded by
// ctx and the request timeout.
func (w *waiter) subscribe(ctx, wctx context.Context) (clientv3.WatchChan, error) {
	start := w.s.timeout
	if start <= 0 {
		start = watchStartTimeout
	}
	bctx, cancel := context.WithTimeoutCause(ctx, start, errTimeout)
	defer cancel()
	w.snap = w.s.sess.snapshot(ref{w.key, w.token})
	if w.snap == nil {
		ks, ke := w.s.keyRange(w.key)
		get, err := w.s.cli.Get(bctx, ks, clientv3.WithRange(ke))
		if err != nil {
			return nil, w.s.wrap(bctx, "watch", w.key, err)
		}
		v := w.s.view(w.key, w.token, get.Kvs, get.Header.Revision)
		w.snap = &queueSnap{rev: v.rev, held: v.held, queue: v.queue}
	}
	ks, ke := w.s.keyRange(w.key)
	var wch clientv3.WatchChan
	sctx, scancel := context.WithCancel(wctx)
	fail := func(err error) (clientv3.WatchChan, error) {
		scancel()
		drain(wch)
		return nil, err
	}
	wch = w.s.cli.Watch(sctx, ks, clientv3.WithRange(ke), clientv3.WithRev(w.snap.rev+1), clientv3.WithCreatedNotify())
	select {
	case wr, ok := <-wch:
		if ok && wr.Created && wr.Err() == nil {
			w.cancelWatch = scancel
			return wch, nil
		}
		err := wr.Err()
		if err == nil {
			err = context.Cause(wctx)
		}
		return fail(w.s.wrap(bctx, "watch", w.key, err))
	case <-bctx.Done():
		return fail(w.s.wrap(bctx, "watch", w.key, fmt.Errorf("%w: etcd did not confirm the watch: %w", ErrUnavailable, context.Cause(bctx))))
	}
}

// loop follows the watch until wctx ends, restarting it after a break.
func (w *waiter) loop(wctx context.Context, wch clientv3.WatchChan) {
	for {
		w.follow(wch)
		w.cancelWatch()
		if wctx.Err() != nil {
			return
		}
		w.signal() // the watch broke: the waiter re-checks
		for {
			var err error
			w.s.sess.forgetSnapshot(ref{w.key, w.token})
			if wch, err = w.subscribe(wctx, wctx); err == nil {
				break
			}
			select {
			case <-wctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// follow applies watch events to the snapshot and signals each time the
// token becomes free to take the key. It returns when the watch ends.
func (w *waiter) follow(wch clientv3.WatchChan) {
	lockKey, mine := w.s.lockKey(w.key), w.s.entryKey(w.key, w.token)
	can := func() bool { return !w.snap.held && headIs(w.snap.queue, mine) }
	was := can() // the waiter tries once after subscribing: no signal yet
	for wr := range wch {
		if wr.Err() != nil {
			drain(wch)
			return
		}
		for _, ev := range wr.Events {
			k := string(ev.Kv.Key)
			switch {
			case k == lockKey:
				w.snap.held = ev.Type == mvccpb.PUT
			case ev.Type == mvccpb.DELETE:
				delete(w.snap.queue, k)
			default:
				w.snap.queue[k] = ev.Kv.CreateRevision
			}
		}
		now := can()
		if now && !was {
			w.signal()
		}
		was = now
	}
}

// headIs reports whether entry is the oldest of queue, or queue is empty.
func headIs(queue map[string]int64, entry string) bool {
	if len(queue) == 0 {
		return true
	}
	rev, ok := queue[entry]
	if !ok {
		return false
	}
	for _, r := range queue {
		if r < rev {
			return false
		}
	}
	return true
}

// drain empties a watch channel whose context was cancelled or that
// failed, until the client closes it.
func drain(wch clientv3.WatchChan) {
	for range wch {
	}
}
