package leasehold

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/driver"
)

// Locker hands out leases on keys of one Store under one set of Options.
// Use one Locker per risk class (its Name labels metrics), e.g. a fail-closed
// "approval" locker and a fail-open "cleanup" locker over the same store.
//
// A Locker is safe for concurrent use. Goroutines of one process contend on a
// local keyed gate (FIFO) before they reach the store, so a Locker has at
// most one store request in flight and at most one lease per key. One
// scheduler goroutine renews every lease (held leases add no goroutine).
// Close stops every goroutine the Locker started.
type Locker struct {
	store    driver.Store
	notifier driver.Notifier // nil when the store cannot notify
	opts     Options
	gate     gate
	sched    *scheduler

	ctx      context.Context // cancelled by Close: wakes waiting acquires
	closeAll context.CancelFunc
	mu       sync.Mutex
	closed   bool
	// configChecked: the one ConfigChecker check was started.
	configChecked atomic.Bool
	bg            sync.WaitGroup // clean-up releases, joined by Close
	waiting       sync.WaitGroup // Acquires waiting for their turn, joined by Close
}

// New returns a Locker over store. It validates opts and returns an error
// wrapping ErrInvalidOptions that names the field to fix. It logs a warning
// when the renewal failure budget does not fit before the local expiry guard
// (see Budget).
func New(store driver.Store, opts Options) (*Locker, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidOptions)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if b := o.budget(); o.OnRenewFailure == RenewalFence && !b.Fits() {
		o.Logger.Warn("leasehold: renewal failure budget exceeds the TTL; the local expiry guard will cancel leases first",
			slog.String("locker", o.Name), slog.Duration("budget", b.Need()), slog.Duration("guard", b.Have()),
			slog.Duration("ttl", o.TTL), slog.Int("max_renew_failures", o.MaxRenewFailures),
			slog.Duration("renew_interval", o.RenewInterval), slog.Duration("renew_timeout", o.RenewTimeout))
	}
	l := &Locker{store: store, opts: o}
	l.sched = newScheduler(l)
	l.ctx, l.closeAll = context.WithCancel(context.Background())
	l.notifier, _ = store.(driver.Notifier)
	return l, nil
}

// Name returns the locker's name, its metrics label.
func (l *Locker) Name() string { return l.opts.Name }

// Options returns the locker's options with defaults filled in.
func (l *Locker) Options() Options { return l.opts }

// Store returns the store the locker uses.
func (l *Locker) Store() driver.Store { return l.store }

// TryAcquire makes one attempt to lease key; it never joins the key's queue.
// It returns an error wrapping ErrNotAcquired when another owner holds key
// (in this process or another) or waiters are queued for it, and a
// *StoreError (matching ErrStore) when the store fails under FailClosed.
// Under FailOpen a store failure returns a degraded, local-only lease.
// A caller whose ctx ended never gets a lease, degraded or not: it gets an
// error matching ctx.Err(), and a grant that raced the end of ctx is released
// by the Locker. A store request in flight when ctx ends gets up to 250 ms
// more to answer, so that the release follows the grant: the call returns
// that much later at most.
//
// The lease is renewed automatically until Release; its Context is cancelled
// when ownership can no longer be trusted.
func (l *Locker) TryAcquire(ctx context.Context, key string) (*Lease, error) {
	return l.acquire(ctx, leaseSpec{key: key, ttl: l.opts.TTL, kind: renewed})
}

// Acquire leases key, waiting in the key's FIFO queue (kept in the store, so
// it is fair across processes) until the key is granted or ctx ends; then it
// returns an error matching both ErrNotAcquired and ctx.Err(). It keeps its
// place by refreshing it every WaiterTTL/3, wakes on the store's
// notification, or at the holder's exact remaining TTL when it is next in
// line, and polls every WaitCap only as a safety net. A waiter that gives up
// leaves the queue. Store failures follow OnStoreError at once; they are not
// retried. Without a deadline on ctx Acquire may wait forever. As with
// TryAcquire, a caller whose ctx ended never gets a lease.
func (l *Locker) Acquire(ctx context.Context, key string) (*Lease, error) {
	return l.acquire(ctx, leaseSpec{key: key, ttl: l.opts.TTL, kind: renewed, wait: true})
}

// Hold is the per-loop TTL hold: one attempt to lease key for ttl (0 means
// the locker's TTL) that is never renewed automatically and need not be
// released. Expiry rotates ownership; the lease's Context ends with
// ErrLeaseExpired just before the store expires the key. Lease.Renew extends
// it by hand.
func (l *Locker) Hold(ctx context.Context, key string, ttl time.Duration) (*Lease, error) {
	switch {
	case ttl < 0:
		return nil, fmt.Errorf("%w: hold TTL must be > 0, got %v", ErrInvalidOptions, ttl)
	case ttl == 0:
		ttl = l.opts.TTL
	case ttl <= l.opts.drift(ttl):
		return nil, fmt.Errorf("%w: hold TTL (%v) must be longer than the drift margin (%v)", ErrInvalidOptions, ttl, l.opts.drift(ttl))
	}
	return l.acquire(ctx, leaseSpec{key: key, ttl: ttl, kind: held})
}

// Close cancels the context of every lease still held (cause
// ErrLockerClosed), releases them in the store (best effort, bounded by
// ReleaseTimeout), wakes every Acquire still waiting (it returns
// ErrLockerClosed and leaves the key's queue), and waits for every renewal
// and clean-up in progress. Later acquires return ErrLockerClosed. Close is
// idempotent.
func (l *Locker) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.closeAll()
	l.waiting.Wait() // woken waiters have left their queues
	leases := l.sched.closeAll()
	sem := make(chan struct{}, closeParallel)
	var wg sync.WaitGroup
	for _, ls := range leases {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			ls.closeByLocker()
		}()
	}
	wg.Wait()
	l.sched.shutdown()
	l.bg.Wait()
	return nil
}

// closeParallel bounds how many releases Close sends at once, so closing a
// Locker with many leases over a dead store takes a few ReleaseTimeouts, not
// one per lease.
const closeParallel = 16

// enterWait registers an Acquire that is about to wait for its turn, so
// that Close waits until it has left the key's queue; false once Close began.
func (l *Locker) enterWait() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.waiting.Add(1)
	return true
}

// release deletes key's lock if token holds it, or takes token out of key's
// queue, on ctx's values bounded by ReleaseTimeout. It is a clean-up: its
// outcome is only logged.
func (l *Locker) release(ctx context.Context, ops keyOps, key, token string) {
	rctx, cancel := context.WithTimeout(detach(ctx), l.opts.ReleaseTimeout)
	defer cancel()
	err := ops.release(rctx, key, token)
	if err != nil && !errors.Is(err, ErrNotHeld) && !errors.Is(err, ErrNotOwned) {
		l.opts.Logger.DebugContext(ctx, "leasehold: clean-up release failed", slog.String("locker", l.opts.Name),
			slog.String("key", key), slog.String("token", tokenPrefix(token)), slog.Any("error", err))
	}
}

// background runs a clean-up release in a goroutine the Locker owns: Close
// waits for it. It runs on a context detached from the caller and from
// Close, bounded by ReleaseTimeout, so it survives Close. Once Close began it
// runs in the caller's goroutine instead (Close waits for a waiting Acquire
// to get there; an acquire call racing Close finishes it before it returns).
func (l *Locker) background(ctx context.Context, ops keyOps, key, token string) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.release(ctx, ops, key, token)
		return
	}
	l.bg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.bg.Done()
		l.release(ctx, ops, key, token)
	}()
}

func (l *Locker) observe(e Event) {
	e.Locker = l.opts.Name
	l.opts.Observer.Observe(e)
}
