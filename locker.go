package leasehold

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// Locker hands out leases on keys of one Store under one set of Options.
// Use one Locker per risk class (its Name labels metrics), e.g. a fail-closed
// "approval" locker and a fail-open "cleanup" locker over the same store.
//
// A Locker is safe for concurrent use. Goroutines of one process contend on a
// local keyed gate before they reach the store, so a Locker has at most one
// store request in flight and at most one lease per key. Close stops every
// goroutine the Locker started.
type Locker struct {
	store    Store
	notifier Notifier // nil when the store cannot notify
	opts     Options
	gate     gate

	ctx      context.Context // cancelled by Close: aborts renewals in flight
	closeAll context.CancelFunc
	mu       sync.Mutex
	closed   bool
	leases   map[*Lease]struct{} // held leases, for Close
	bg       sync.WaitGroup      // forget goroutines
}

// New returns a Locker over store. It validates opts and returns an error
// wrapping ErrInvalidOptions that names the field to fix.
func New(store Store, opts Options) (*Locker, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidOptions)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if budget := time.Duration(o.MaxRenewFailures) * o.RenewInterval; o.OnRenewFailure == RenewalFence && budget > o.TTL {
		o.Logger.Warn("leasehold: renewal failure budget exceeds the TTL; the local expiry guard will cancel leases first",
			slog.String("locker", o.Name), slog.Duration("budget", budget), slog.Duration("ttl", o.TTL),
			slog.Int("max_renew_failures", o.MaxRenewFailures), slog.Duration("renew_interval", o.RenewInterval))
	}
	l := &Locker{store: store, opts: o, leases: make(map[*Lease]struct{})}
	l.ctx, l.closeAll = context.WithCancel(context.Background())
	l.notifier, _ = store.(Notifier)
	return l, nil
}

// Name returns the locker's name, its metrics label.
func (l *Locker) Name() string { return l.opts.Name }

// Options returns the locker's options with defaults filled in.
func (l *Locker) Options() Options { return l.opts }

// Store returns the store the locker uses.
func (l *Locker) Store() Store { return l.store }

// TryAcquire makes one attempt to lease key. It returns an error wrapping
// ErrNotAcquired when another owner holds key (in this process or another),
// and a *StoreError (matching ErrStore) when the store fails under FailClosed.
// Under FailOpen a store failure returns a degraded, local-only lease.
//
// The lease is renewed automatically until Release; its Context is cancelled
// when ownership can no longer be trusted.
func (l *Locker) TryAcquire(ctx context.Context, key string) (*Lease, error) {
	return l.acquire(ctx, key, l.opts.TTL, false, false)
}

// Acquire leases key, waiting until it is free or ctx ends; then it returns
// an error matching both ErrNotAcquired and ctx.Err(). Waiting does not poll:
// it wakes on the store's release notification (when the store has one) or
// when the holder's remaining TTL runs out, with a capped, jittered backoff
// (Options.WaitCap) as a safety net. Store failures follow OnStoreError at
// once; they are not retried. Without a deadline on ctx Acquire may wait
// forever.
func (l *Locker) Acquire(ctx context.Context, key string) (*Lease, error) {
	return l.acquire(ctx, key, l.opts.TTL, false, true)
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
	return l.acquire(ctx, key, ttl, true, false)
}

// Do is the per-item pattern: it acquires key as Acquire does, runs fn with a
// context that is cancelled when ctx ends or the lease can no longer be
// trusted, and releases the lease when fn returns (also when it panics).
//
// Do returns fn's error, joined with the lease's cause when the lease was
// lost, abandoned or expired while fn ran (so errors.Is(err, ErrLeaseLost)
// works even when fn returned nil: its work may have overlapped another
// owner's), and with the release error if any.
func (l *Locker) Do(ctx context.Context, key string, fn func(ctx context.Context, lease *Lease) error) (err error) {
	lease, err := l.Acquire(ctx, key)
	if err != nil {
		return err
	}
	fnCtx, stop := lease.bind(ctx)
	defer func() {
		stop()
		cause := lease.Err()
		if errors.Is(cause, ErrLeaseReleased) || (err != nil && errors.Is(err, cause)) {
			cause = nil
		}
		rerr := lease.Release(ctx)
		err = errors.Join(err, cause, rerr)
	}()
	return fn(fnCtx, lease)
}

// Loop runs a reconciler on the replica that holds key: every interval it
// keeps (renews) or tries to take a Hold lease on key and, while it holds it,
// calls fn with a context that ends when ctx ends or the lease is lost. It
// never gives up after losing the lease: it keeps contending until ctx ends,
// then releases and returns ctx's error. Errors from fn and from the store are
// logged and counted, not returned. interval must be shorter than the TTL;
// TTL = 2 × interval is a good start.
func (l *Locker) Loop(ctx context.Context, key string, interval time.Duration, fn func(ctx context.Context, lease *Lease) error) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if interval <= 0 || interval >= l.opts.TTL {
		return fmt.Errorf("%w: loop interval (%v) must be > 0 and shorter than the TTL (%v)", ErrInvalidOptions, interval, l.opts.TTL)
	}
	log := l.opts.Logger.With(slog.String("locker", l.opts.Name), slog.String("key", key))
	var lease *Lease
	defer func() {
		if lease != nil {
			_ = lease.Release(context.WithoutCancel(ctx))
		}
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if lease != nil {
			switch {
			case lease.Err() != nil || lease.Degraded():
				_ = lease.Release(ctx)
				lease = nil
			default:
				if err := lease.Renew(ctx); err != nil && lease.Err() != nil {
					lease = nil
				}
			}
		}
		if lease == nil {
			var err error
			lease, err = l.Hold(ctx, key, 0)
			if err != nil && !errors.Is(err, ErrNotAcquired) && ctx.Err() == nil {
				log.Warn("leasehold: loop could not acquire", slog.Any("error", err))
			}
		}
		if lease != nil && lease.Err() == nil {
			fnCtx, stop := lease.bind(ctx)
			if err := fn(fnCtx, lease); err != nil && ctx.Err() == nil {
				log.Warn("leasehold: loop function failed", slog.Uint64("fence", lease.Fence()), slog.Any("error", err))
			}
			stop()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Close cancels the context of every lease still held (cause
// ErrLockerClosed), releases them in the store (best effort, bounded by
// ReleaseTimeout), wakes every Acquire still waiting (it returns
// ErrLockerClosed), and waits for every renewal and clean-up in progress. Later
// acquires return ErrLockerClosed. Close is idempotent.
func (l *Locker) Close() error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		l.closeAll()
	}
	leases := make([]*Lease, 0, len(l.leases))
	for ls := range l.leases {
		leases = append(leases, ls)
	}
	l.mu.Unlock()
	for _, ls := range leases {
		ls.closeByLocker()
		l.untrack(ls)
	}
	l.bg.Wait()
	return nil
}

// forget releases, in a goroutine the locker owns (Close waits for it), the
// lock an acquire may have taken although its reply was lost. It is
// token-checked: it never touches another owner's lock.
func (l *Locker) forget(key, token string) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.bg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.bg.Done()
		ctx, cancel := context.WithTimeout(l.ctx, l.opts.ReleaseTimeout)
		defer cancel()
		_ = l.store.Release(ctx, key, token)
	}()
}

// track registers a new lease; false when the locker is closed.
func (l *Locker) track(ls *Lease) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.leases[ls] = struct{}{}
	return true
}

// maxBatch caps how many leases one batch renewal carries.
const maxBatch = 256

// claimPeers claims the locker's other leases that are due for renewal
// within a quarter of RenewInterval from now, and whose guard deadline is not
// before validTo, for a batch renewal by self. Renewing them a little early
// is harmless and saves round trips.
func (l *Locker) claimPeers(self *Lease, now, validTo time.Time) []*Lease {
	before := now.Add(l.opts.RenewInterval / 4)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.leases) < 2 {
		return nil
	}
	var peers []*Lease
	for p := range l.leases {
		if p != self && p.claim(before, validTo) {
			if peers = append(peers, p); len(peers) == maxBatch-1 {
				break
			}
		}
	}
	return peers
}

func (l *Locker) untrack(ls *Lease) {
	l.mu.Lock()
	delete(l.leases, ls)
	l.mu.Unlock()
}

func (l *Locker) observe(e Event) {
	e.Locker = l.opts.Name
	l.opts.Observer.Observe(e)
}

// acquire is the one acquire path. hold leases are not renewed; wait makes it
// block until ctx ends.
func (l *Locker) acquire(ctx context.Context, key string, ttl time.Duration, hold, wait bool) (*Lease, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	if l.ctx.Err() != nil {
		return nil, ErrLockerClosed
	}
	start := time.Now()
	contended := func(err error) (*Lease, error) {
		l.observe(Event{Kind: EventAcquire, Key: key, Result: ResultContended, Duration: time.Since(start)})
		return nil, err
	}
	var entry *gateEntry
	if wait {
		var err error
		if entry, err = l.gate.lock(ctx, key, l.ctx.Done()); err != nil {
			if errors.Is(err, ErrLockerClosed) {
				return nil, err
			}
			return contended(errors.Join(fmt.Errorf("%w: %q: gave up waiting", ErrNotAcquired, key), err))
		}
	} else {
		var ok bool
		if entry, ok = l.gate.tryLock(key); !ok {
			l.observe(Event{Kind: EventContention, Key: key})
			return contended(fmt.Errorf("%w: %q is held by another goroutine of this process", ErrNotAcquired, key))
		}
	}
	unlock := func() { l.gate.unlock(entry) }
	token := NewToken()
	backoff := 25 * time.Millisecond
	var (
		released <-chan struct{}
		stopSub  func()
		seenHeld bool // another owner was seen holding key during this call
	)
	defer func() {
		if stopSub != nil {
			stopSub()
		}
	}()
	for {
		sent := time.Now()
		g, err := l.store.Acquire(ctx, AcquireRequest{Key: key, Token: token, TTL: ttl})
		if err == nil {
			lease, err := l.newLease(ctx, key, token, g.Fence, ttl, sent, hold, false, entry)
			if err != nil {
				return nil, err
			}
			l.observe(Event{Kind: EventAcquire, Key: key, Result: ResultAcquired, Fence: g.Fence, Duration: time.Since(start)})
			return lease, nil
		}
		if errors.Is(err, ErrNotAcquired) {
			seenHeld = true
			l.observe(Event{Kind: EventContention, Key: key})
			if !wait {
				unlock()
				return contended(fmt.Errorf("%w: %q is held by another owner (%v left)", ErrNotAcquired, key, g.Remaining))
			}
			if l.notifier != nil && stopSub == nil {
				// Subscribe, then try again at once: a release between the
				// first try and the subscription is not missed.
				if ch, stop, serr := l.notifier.WaitRelease(ctx, key, token); serr == nil {
					released, stopSub = ch, stop
					continue
				}
			}
			var d time.Duration
			if g.Remaining > 0 {
				d = g.Remaining + time.Millisecond
			} else {
				d = backoff
				backoff = min(2*backoff, l.opts.WaitCap)
			}
			d = min(d, l.opts.WaitCap)
			d += rand.N(d/10 + time.Millisecond)
			t := time.NewTimer(d)
			select {
			case <-released:
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				unlock()
				return contended(errors.Join(fmt.Errorf("%w: %q: gave up waiting", ErrNotAcquired, key), ctx.Err()))
			case <-l.ctx.Done():
				t.Stop()
				unlock()
				return nil, ErrLockerClosed
			}
			t.Stop()
			continue
		}
		// The store may have applied the acquire and lost its reply: release
		// that lock (token-checked) rather than leave it for a whole TTL.
		l.forget(key, token)
		if cerr := ctx.Err(); cerr != nil {
			// The caller gave up; that is not a sick store.
			unlock()
			return contended(errors.Join(fmt.Errorf("%w: %q", ErrNotAcquired, key), cerr))
		}
		serr := storeErr("acquire", key, err)
		l.observe(Event{Kind: EventStoreError, Key: key, Op: "acquire", Err: err})
		l.observe(Event{Kind: EventAcquire, Key: key, Result: ResultError, Duration: time.Since(start), Err: err})
		if l.opts.OnStoreError != FailOpen || seenHeld {
			// Fail open never when this call saw another owner holding the
			// key: that would be a certain duplicate, not a possible one.
			unlock()
			return nil, serr
		}
		l.observe(Event{Kind: EventFailOpen, Key: key, Err: err})
		l.opts.Logger.ErrorContext(ctx, "leasehold: store failed, failing open with a local-only lease: cross-replica races are now possible",
			slog.String("locker", l.opts.Name), slog.String("key", key), slog.Any("error", err))
		return l.newLease(ctx, key, token, 0, ttl, sent, hold, true, entry)
	}
}
