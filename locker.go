package leasehold

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/driver"
)

// Locker hands out leases on keys of one store: use one per risk class. It is
// safe for concurrent use; goroutines of one process queue FIFO on a local
// per-key gate first.
type Locker struct {
	store    driver.Store
	notifier driver.Notifier // nil when the store cannot notify
	opts     Options
	gate     gate
	sched    *scheduler
	keep     *keeper // nil when the store cannot refresh queue places

	ctx      context.Context // cancelled by Close: wakes waiting acquires
	closeAll context.CancelFunc
	mu       sync.Mutex
	closed   bool
	retries  []pendingRelease // failed releases to send again (retryRelease), guarded by mu
	retrying bool             // retryLoop runs, guarded by mu
	// configChecked: the one ConfigChecker check was started.
	configChecked atomic.Bool
	bg            sync.WaitGroup // clean-up releases, the config check and Observe loops, joined by Close
	waiting       sync.WaitGroup // Acquires waiting for their turn, joined by Close
}

// New returns a Locker over store, or an error wrapping ErrInvalidOptions that
// names the field to fix.
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
	l.keep = newKeeper(l)
	return l, nil
}

// Name returns the locker's name, its metrics label.
func (l *Locker) Name() string { return l.opts.Name }

// Options returns the locker's options with defaults filled in.
func (l *Locker) Options() Options { return l.opts }

// Store returns the store the locker uses.
func (l *Locker) Store() driver.Store { return l.store }

// TryAcquire makes one attempt to lease key, without queueing: an error
// wrapping ErrNotAcquired when another owner holds key or others wait, a
// *StoreError on a store failure (FailOpen: a degraded lease).
func (l *Locker) TryAcquire(ctx context.Context, key string) (*Lease, error) {
	return l.acquire(ctx, leaseSpec{key: key, ttl: l.opts.TTL, kind: renewed})
}

// Acquire leases key, waiting in the key's FIFO queue until it is granted or
// ctx ends (an error matching ErrNotAcquired and ctx.Err()).
func (l *Locker) Acquire(ctx context.Context, key string) (*Lease, error) {
	return l.acquire(ctx, leaseSpec{key: key, ttl: l.opts.TTL, kind: renewed, wait: true})
}

// Hold makes one attempt to lease key for ttl (0: the TTL), never renewed
// automatically and not to be released: expiry rotates ownership.
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

// Close ends and releases every lease (cause ErrLockerClosed), ends every
// waiting Acquire and waits for the Locker's goroutines. It is idempotent.
func (l *Locker) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.closeAll()
	l.waiting.Wait() // woken waiters have left their queues
	if l.keep != nil {
		l.keep.wait()
	}
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
// outcome is only logged, and returned.
func (l *Locker) release(ctx context.Context, ops keyOps, key, token string) error {
	rctx, cancel := context.WithTimeout(detach(ctx), l.opts.ReleaseTimeout)
	defer cancel()
	err := ops.release(rctx, key, token)
	if err != nil && !errors.Is(err, ErrNotHeld) && !errors.Is(err, ErrNotOwned) {
		l.opts.Logger.DebugContext(ctx, "leasehold: clean-up release failed", slog.String("locker", l.opts.Name),
			slog.String("key", key), slog.String("token", tokenPrefix(token)), slog.Any("error", err))
		return err
	}
	return nil
}

// background runs a clean-up release in a goroutine the Locker owns: Close
// waits for it. It runs on a context detached from the caller and from
// Close, bounded by ReleaseTimeout, so it survives Close; one that fails
// while the store is unavailable is retried (retryRelease). Once Close began
// it runs in the caller's goroutine instead, once (Close waits for a waiting
// Acquire to get there; an acquire call racing Close finishes it before it
// returns).
func (l *Locker) background(ctx context.Context, ops keyOps, key, token string) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		_ = l.release(ctx, ops, key, token)
		return
	}
	l.bg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.bg.Done()
		if err := l.release(ctx, ops, key, token); errors.Is(err, ErrUnavailable) {
			l.retryRelease(ctx, ops, key, token)
		}
	}()
}

// pendingRelease is a release that failed while the store was unavailable.
type pendingRelease struct {
	ctx        context.Context
	ops        keyOps
	key, token string
	giveUp     time.Time
}

// retryRelease queues a release that failed while the store was
// unavailable, for the Locker's one retrying goroutine: every WaitCap it
// sends the queued releases in turn, and stops the pass at the first that
// finds the store still unavailable, which goes last (one request a round
// during an outage; a key that stays unavailable, a Redis Cluster shard
// down, does not hold up the others).
// A release is dropped once it succeeds or is refused for another reason,
// after keptFactor × WaiterTTL (a place kept by a presence lives that long
// on Redis and PostgreSQL), or when Close begins. Without it, a waiter that
// gave up while a failover lost its release left its place behind, to be
// handed the key nobody takes; and on etcd, a lock handed to a waiter lives
// on its Store's presence until its first renewal moves it, so a lost
// release held the key for as long as that Store kept waiting.
func (l *Locker) retryRelease(ctx context.Context, ops keyOps, key, token string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.retries = append(l.retries, pendingRelease{ctx, ops, key, token, time.Now().Add(keptFactor * l.opts.WaiterTTL)})
	if !l.retrying {
		l.retrying = true
		l.bg.Add(1)
		go l.retryLoop()
	}
}

// retryLoop is the retrying goroutine of retryRelease: it ends when no
// release is left, or at Close.
func (l *Locker) retryLoop() {
	defer l.bg.Done()
	for sleepCtx(l.ctx, l.ctx, l.opts.WaitCap) {
		l.mu.Lock()
		pass := l.retries
		l.retries = nil
		l.mu.Unlock()
		var keep []pendingRelease
		for i, p := range pass {
			if l.ctx.Err() != nil {
				return
			}
			if err := l.release(p.ctx, p.ops, p.key, p.token); errors.Is(err, ErrUnavailable) {
				keep = append(append(keep, pass[i+1:]...), p) // still down: the rest waits, p goes last
				break
			}
		}
		keep = slices.DeleteFunc(keep, func(p pendingRelease) bool { return time.Now().After(p.giveUp) })
		l.mu.Lock()
		l.retries = append(keep, l.retries...)
		if len(l.retries) == 0 {
			l.retrying = false
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
	}
}

func (l *Locker) observe(e Event) {
	e.Locker = l.opts.Name
	l.opts.Observer.Observe(e)
}
