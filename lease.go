package leasehold

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Lease is a successful acquisition of a key. Its methods are safe for
// concurrent use. A Lease from TryAcquire, Acquire or Do is renewed
// automatically until Release; a Lease from Hold is not.
type Lease struct {
	l        *Locker
	key      string
	token    string
	fence    uint64
	ttl      time.Duration
	acquired time.Time
	hold     bool // per-loop TTL hold: no automatic renewal
	degraded bool // fail-open, local-only

	ctx    context.Context
	cancel context.CancelCauseFunc
	unlock func() // frees the local gate; idempotent

	// kctx ends the in-flight renewal when Release or Close stops the keeper.
	kctx    context.Context
	kcancel context.CancelFunc

	stop chan struct{} // closed by Release: the keeper exits
	done chan struct{} // closed when the keeper has exited
	bump chan struct{} // a manual Renew moved validUntil

	mu         sync.Mutex
	validUntil time.Time // local expiry guard deadline (monotonic)
	over       bool      // ownership ended: released, lost, abandoned, expired or closed
	releasing  bool
	maxHeld    bool
}

func (l *Locker) newLease(ctx context.Context, key, token string, fence uint64, ttl time.Duration, sent time.Time, hold, degraded bool, unlock func()) (*Lease, error) {
	lctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	ls := &Lease{
		l: l, key: key, token: token, fence: fence, ttl: ttl, acquired: sent,
		hold: hold, degraded: degraded,
		ctx: lctx, cancel: cancel, unlock: unlock,
		stop: make(chan struct{}), done: make(chan struct{}), bump: make(chan struct{}, 1),
		validUntil: sent.Add(ttl - l.opts.drift(ttl)),
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		cancel(ErrLockerClosed)
		if !degraded {
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.ReleaseTimeout)
			_ = l.store.Release(rctx, key, token)
			rcancel()
		}
		unlock()
		return nil, ErrLockerClosed
	}
	l.wg.Add(1)
	l.mu.Unlock()
	ls.kctx, ls.kcancel = context.WithCancel(l.ctx)
	go ls.keep()
	return ls, nil
}

// Key returns the leased key.
func (ls *Lease) Key() string { return ls.key }

// Token returns the owner token: 128 random bits, unique per acquisition.
func (ls *Lease) Token() string { return ls.token }

// Fence returns the fence token: strictly greater than the fence of every
// earlier acquisition of the key. Pass it to the storage you write to (package
// fence) so a stale holder's writes are rejected. A degraded lease has fence 0.
func (ls *Lease) Fence() uint64 { return ls.fence }

// TTL returns the lease's time to live.
func (ls *Lease) TTL() time.Duration { return ls.ttl }

// Degraded reports whether this is a fail-open, local-only lease: the store
// was unreachable, so only goroutines of this process are excluded.
func (ls *Lease) Degraded() bool { return ls.degraded }

// Context returns a context that is cancelled the moment ownership can no
// longer be trusted, or when the lease is released. context.Cause tells why:
// ErrLeaseLost, ErrLeaseAbandoned, ErrLeaseExpired, ErrMaxHoldReached,
// ErrLeaseReleased or ErrLockerClosed. It carries the values of the context
// the lease was acquired with, not its cancellation.
func (ls *Lease) Context() context.Context { return ls.ctx }

// Done is Context().Done().
func (ls *Lease) Done() <-chan struct{} { return ls.ctx.Done() }

// Err returns nil while the lease is held and trusted, else the cause of its
// end (see Context).
func (ls *Lease) Err() error {
	if ls.ctx.Err() == nil {
		return nil
	}
	return context.Cause(ls.ctx)
}

// ValidUntil returns the local expiry guard's deadline: the time before which
// the holder may trust its ownership, measured from before the last successful
// renewal was sent, minus the drift margin.
func (ls *Lease) ValidUntil() time.Time {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.validUntil
}

// Renew extends the lease by its TTL now, token-checked on the store. It
// returns an error wrapping ErrNotOwned (and ends the lease with
// ErrLeaseLost) when another owner has the key, a *StoreError when the store
// fails (the lease stays until its local expiry), the lease's cause when it
// already ended, and ErrMaxHoldReached after the maximum hold time. A degraded
// lease has nothing to renew in the store; Renew extends its local deadline.
func (ls *Lease) Renew(ctx context.Context) error {
	ls.mu.Lock()
	over, maxHeld := ls.over, ls.maxHeld
	ls.mu.Unlock()
	switch {
	case over:
		if err := ls.Err(); err != nil {
			return err
		}
		return ErrLeaseReleased
	case maxHeld:
		return ErrMaxHoldReached
	}
	sent := time.Now()
	if ls.degraded {
		ls.extend(sent)
		return nil
	}
	err := ls.l.store.Renew(ctx, ls.key, ls.token, ls.ttl)
	switch {
	case err == nil:
		ls.extend(sent)
		ls.l.observe(Event{Kind: EventRenewed, Key: ls.key, Fence: ls.fence, Duration: time.Since(sent)})
		return nil
	case errors.Is(err, ErrNotOwned):
		ls.notOwned("renew")
		ls.end(ErrLeaseLost, EventLost)
		return fmt.Errorf("renew %q: %w", ls.key, ErrNotOwned)
	default:
		ls.l.observe(Event{Kind: EventStoreError, Key: ls.key, Op: "renew", Err: err})
		ls.l.observe(Event{Kind: EventRenewFailed, Key: ls.key, Fence: ls.fence, Attempt: 1, Err: err})
		return storeErr("renew", ls.key, err)
	}
}

// Release ends the lease: it stops renewal, cancels Context with
// ErrLeaseReleased and deletes the lock in the store if and only if this
// lease's token still owns it. It returns an error wrapping ErrNotOwned when
// another owner has the key (that lock is left alone) and a *StoreError when
// the store fails (the lock then expires by its TTL).
//
// Release is a no-op that returns nil after the lease was lost, abandoned,
// expired locally or released: ask Err or context.Cause why. It runs on ctx's
// values but not its cancellation, bounded by Options.ReleaseTimeout, so it
// works with the lease's already-cancelled context.
func (ls *Lease) Release(ctx context.Context) error {
	ls.mu.Lock()
	if ls.releasing {
		ls.mu.Unlock()
		return nil
	}
	ls.releasing = true
	ls.mu.Unlock()
	close(ls.stop)
	ls.kcancel()
	<-ls.done

	ls.mu.Lock()
	over := ls.over
	ls.over = true
	ls.mu.Unlock()
	if over {
		return nil
	}
	defer ls.unlock()
	ls.l.observe(Event{Kind: EventReleased, Key: ls.key, Fence: ls.fence, Duration: time.Since(ls.acquired)})
	ls.observeHeld(ErrLeaseReleased)
	ls.cancel(ErrLeaseReleased)
	if ls.degraded {
		return nil
	}
	return ls.storeRelease(ctx)
}

func (ls *Lease) storeRelease(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ls.l.opts.ReleaseTimeout)
	defer cancel()
	err := ls.l.store.Release(rctx, ls.key, ls.token)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotOwned):
		ls.notOwned("release")
		return fmt.Errorf("release %q: %w", ls.key, ErrNotOwned)
	default:
		ls.l.observe(Event{Kind: EventStoreError, Key: ls.key, Op: "release", Err: err})
		return storeErr("release", ls.key, err)
	}
}

// bind returns a context that ends when parent ends or the lease ends, with
// the lease's cause in the latter case.
func (ls *Lease) bind(parent context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	stop := context.AfterFunc(ls.ctx, func() { cancel(context.Cause(ls.ctx)) })
	return ctx, func() { stop(); cancel(nil) }
}

func (ls *Lease) log() *slog.Logger {
	return ls.l.opts.Logger.With(slog.String("locker", ls.l.opts.Name), slog.String("key", ls.key),
		slog.String("token", tokenPrefix(ls.token)), slog.Uint64("fence", ls.fence))
}

func (ls *Lease) notOwned(op string) {
	ls.l.observe(Event{Kind: EventNotOwned, Key: ls.key, Op: op, Fence: ls.fence})
	ls.log().Warn("leasehold: lock not owned", slog.String("op", op))
}

// extend moves the local expiry guard to sent+TTL-drift, never backward.
func (ls *Lease) extend(sent time.Time) {
	until := sent.Add(ls.ttl - ls.l.opts.drift(ls.ttl))
	ls.mu.Lock()
	if until.After(ls.validUntil) {
		ls.validUntil = until
	}
	ls.mu.Unlock()
	select {
	case ls.bump <- struct{}{}:
	default:
	}
}

// end marks ownership as over for cause, reports kind (0: nothing) and the
// held duration once, then cancels the context and frees the local gate.
// Events are reported before the cancellation, so an observer has seen them
// by the time Done is closed.
func (ls *Lease) end(cause error, kind EventKind) {
	ls.mu.Lock()
	if ls.over {
		ls.mu.Unlock()
		return
	}
	ls.over = true
	ls.mu.Unlock()
	if kind != 0 {
		ls.l.observe(Event{Kind: kind, Key: ls.key, Fence: ls.fence, Err: cause})
	}
	ls.observeHeld(cause)
	ls.cancel(cause)
	ls.unlock()
}

// observeHeld reports the end of the lease with the context's cause: the
// first cause wins (a lease past MaxHold that is released reports max hold).
func (ls *Lease) observeHeld(cause error) {
	if ls.ctx.Err() != nil {
		cause = context.Cause(ls.ctx)
	}
	ls.l.observe(Event{Kind: EventHeld, Key: ls.key, Fence: ls.fence, Duration: time.Since(ls.acquired), Err: cause})
}

// keep is the lease's one goroutine: automatic renewal, the local expiry
// guard and the maximum hold time. It exits on Release, on Close and when the
// lease ends; Release and Close wait for it.
func (ls *Lease) keep() {
	defer ls.l.wg.Done()
	defer close(ls.done)
	o := &ls.l.opts

	kctx := ls.kctx
	defer ls.kcancel()

	var guardC <-chan time.Time
	guard := time.NewTimer(time.Until(ls.ValidUntil()))
	defer guard.Stop()
	if !ls.degraded || ls.hold {
		guardC = guard.C
	}
	var renewC <-chan time.Time
	renew := time.NewTimer(o.RenewInterval)
	defer renew.Stop()
	if !ls.hold && !ls.degraded {
		renewC = renew.C
	}
	var maxC <-chan time.Time
	if o.MaxHold > 0 && !ls.hold {
		t := time.NewTimer(time.Until(ls.acquired.Add(o.MaxHold)))
		defer t.Stop()
		maxC = t.C
	}
	failures := 0
	for {
		select {
		case <-ls.stop:
			return
		case <-ls.l.ctx.Done():
			ls.closeByLocker()
			return
		case <-ls.bump:
			guard.Reset(time.Until(ls.ValidUntil()))
		case <-guardC:
			if d := time.Until(ls.ValidUntil()); d > 0 { // a manual Renew moved it
				guard.Reset(d)
				continue
			}
			if ls.hold {
				ls.end(ErrLeaseExpired, 0)
				return
			}
			if o.OnRenewFailure == RenewalContinue && renewC != nil {
				ls.l.observe(Event{Kind: EventExpired, Key: ls.key, Fence: ls.fence})
				ls.log().Warn("leasehold: lease expired locally; continuing by policy", slog.Int("attempt", failures))
				guardC = nil
				continue
			}
			ls.log().Error("leasehold: lease expired locally", slog.Int("attempt", failures))
			ls.end(ErrLeaseExpired, EventExpired)
			return
		case <-maxC:
			maxC, renewC = nil, nil
			ls.mu.Lock()
			ls.maxHeld = true
			ls.mu.Unlock()
			ls.l.observe(Event{Kind: EventMaxHold, Key: ls.key, Fence: ls.fence})
			ls.cancel(ErrMaxHoldReached)
			ls.log().Warn("leasehold: maximum hold time reached", slog.Duration("max_hold", o.MaxHold))
			if guardC == nil { // Continue policy past local expiry
				guardC = guard.C
				guard.Reset(time.Until(ls.ValidUntil()))
			}
		case <-renewC:
			if !ls.renewOnce(kctx, &failures) {
				return
			}
			if guardC == nil && o.OnRenewFailure == RenewalContinue && failures == 0 {
				guardC = guard.C
			}
			renew.Reset(o.RenewInterval)
		}
	}
}

// renewOnce makes one automatic renewal attempt and reports whether the
// keeper goes on.
func (ls *Lease) renewOnce(kctx context.Context, failures *int) bool {
	o := &ls.l.opts
	sent := time.Now()
	deadline := sent.Add(o.RenewTimeout)
	if vu := ls.ValidUntil(); o.OnRenewFailure == RenewalFence && vu.Before(deadline) {
		deadline = vu // never wait past local expiry
	}
	ctx, cancel := context.WithDeadline(kctx, deadline)
	err := ls.l.store.Renew(ctx, ls.key, ls.token, ls.ttl)
	cancel()
	switch {
	case err == nil:
		*failures = 0
		ls.extend(sent)
		ls.l.observe(Event{Kind: EventRenewed, Key: ls.key, Fence: ls.fence, Duration: time.Since(sent)})
		return true
	case errors.Is(err, ErrNotOwned):
		ls.notOwned("renew")
		ls.log().Error("leasehold: lease lost")
		ls.end(ErrLeaseLost, EventLost)
		return false
	case kctx.Err() != nil:
		return true // Release or Close is stopping the keeper
	}
	*failures++
	ls.l.observe(Event{Kind: EventStoreError, Key: ls.key, Op: "renew", Err: err})
	ls.l.observe(Event{Kind: EventRenewFailed, Key: ls.key, Fence: ls.fence, Attempt: *failures, Err: err})
	ls.log().Warn("leasehold: lease renewal failed", slog.Int("attempt", *failures), slog.Any("error", err))
	if o.OnRenewFailure == RenewalFence && *failures >= o.MaxRenewFailures {
		ls.log().Error("leasehold: lease abandoned", slog.Int("attempt", *failures), slog.Any("error", err))
		ls.l.observe(Event{Kind: EventAbandoned, Key: ls.key, Fence: ls.fence, Attempt: *failures, Err: err})
		ls.end(ErrLeaseAbandoned, 0)
		return false
	}
	return true
}

// closeByLocker ends the lease because its Locker is closing, releasing it in
// the store unless ownership is already untrusted.
func (ls *Lease) closeByLocker() {
	ls.mu.Lock()
	if ls.over || ls.releasing {
		ls.mu.Unlock()
		return
	}
	ls.over = true
	ls.mu.Unlock()
	defer ls.unlock()
	ls.observeHeld(ErrLockerClosed)
	ls.cancel(ErrLockerClosed)
	if !ls.degraded {
		_ = ls.storeRelease(context.Background())
	}
}
