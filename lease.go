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
//
// A lease starts no goroutine of its own: one timer drives automatic
// renewal, the local expiry guard and the maximum hold time, and its callback
// runs one at a time. Release and Locker.Close stop the timer and wait for a
// callback in progress, so nothing the lease started outlives it.
type Lease struct {
	l        *Locker
	key      string
	token    string
	fence    uint64
	ttl      time.Duration
	drift    time.Duration
	acquired time.Time
	hold     bool // per-loop TTL hold: no automatic renewal
	degraded bool // fail-open, local-only

	ctx    context.Context
	cancel context.CancelCauseFunc
	gate   *gateEntry // the local gate, freed exactly once by whoever sets over

	mu          sync.Mutex
	timer       *time.Timer
	validUntil  time.Time // local expiry guard deadline (monotonic)
	nextRenew   time.Time // zero: no automatic renewal
	maxHoldAt   time.Time // zero: no cap
	failures    int       // consecutive failed automatic renewals
	guardOff    bool      // RenewalContinue past local expiry
	maxHeld     bool
	over        bool // ownership ended: released, lost, abandoned, expired or closed
	stopped     bool // Release or Close took over: the timer must not act
	inTick      bool
	idle        chan struct{}      // closed when the running tick returns, for a waiter
	renewCancel context.CancelFunc // aborts the automatic renewal in flight
}

func (l *Locker) newLease(ctx context.Context, key, token string, fence uint64, ttl time.Duration, sent time.Time, hold, degraded bool, entry *gateEntry) (*Lease, error) {
	lctx, cancel := context.WithCancelCause(detach(ctx))
	ls := &Lease{
		l: l, key: key, token: token, fence: fence, ttl: ttl, drift: l.opts.drift(ttl), acquired: sent,
		hold: hold, degraded: degraded,
		ctx: lctx, cancel: cancel, gate: entry,
	}
	ls.validUntil = sent.Add(ttl - ls.drift)
	if !hold && !degraded {
		ls.nextRenew = sent.Add(l.opts.RenewInterval)
	}
	if !hold && l.opts.MaxHold > 0 {
		ls.maxHoldAt = sent.Add(l.opts.MaxHold)
	}
	if !l.track(ls) {
		cancel(ErrLockerClosed)
		if !degraded {
			rctx, rcancel := context.WithTimeout(detach(ctx), l.opts.ReleaseTimeout)
			_ = l.store.Release(rctx, key, token)
			rcancel()
		}
		l.gate.unlock(entry)
		return nil, ErrLockerClosed
	}
	ls.mu.Lock()
	ls.schedule()
	ls.mu.Unlock()
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
	over, maxHeld := ls.over || ls.stopped, ls.maxHeld
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
// works with the lease's already-cancelled context. A renewal in flight is
// cancelled first, and Release waits for it to return.
func (ls *Lease) Release(ctx context.Context) error {
	if !ls.stop() {
		return nil
	}
	defer ls.l.untrack(ls)
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

// stop keeps the timer from acting again and waits for a callback in
// progress. It reports false when the lease was already stopped.
func (ls *Lease) stop() bool {
	ls.mu.Lock()
	if ls.stopped {
		ls.mu.Unlock()
		return false
	}
	ls.stopped = true
	if ls.timer != nil {
		ls.timer.Stop()
	}
	if ls.renewCancel != nil {
		ls.renewCancel()
	}
	var wait chan struct{}
	if ls.inTick {
		if ls.idle == nil {
			ls.idle = make(chan struct{})
		}
		wait = ls.idle
	}
	ls.mu.Unlock()
	if wait != nil {
		<-wait
	}
	return true
}

func (ls *Lease) storeRelease(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(detach(ctx), ls.l.opts.ReleaseTimeout)
	defer cancel()
	err := ls.l.store.Release(rctx, ls.key, ls.token)
	switch {
	case err == nil, errors.Is(err, ErrNotHeld): // already gone: expired, or our retried release applied
		return nil
	case errors.Is(err, ErrNotOwned):
		ls.notOwned("release")
		return fmt.Errorf("release %q: %w", ls.key, ErrNotOwned)
	default:
		ls.l.observe(Event{Kind: EventStoreError, Key: ls.key, Op: "release", Err: err})
		return storeErr("release", ls.key, err)
	}
}

// closeByLocker ends the lease because its Locker is closing, releasing it in
// the store unless ownership is already untrusted.
func (ls *Lease) closeByLocker() {
	if !ls.stop() {
		return
	}
	ls.mu.Lock()
	over := ls.over
	ls.over = true
	ls.mu.Unlock()
	if over {
		return
	}
	defer ls.unlock()
	ls.observeHeld(ErrLockerClosed)
	ls.cancel(ErrLockerClosed)
	if !ls.degraded {
		_ = ls.storeRelease(context.Background())
	}
}

// unlock frees the local gate. Call it once, from whoever set ls.over.
func (ls *Lease) unlock() { ls.l.gate.unlock(ls.gate) }

// detach returns ctx's values without its cancellation.
func detach(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		return ctx // never cancelled: nothing to detach
	}
	return context.WithoutCancel(ctx)
}

// bind returns a context that ends when parent ends or the lease ends, with
// the lease's cause in the latter case.
func (ls *Lease) bind(parent context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	stop := context.AfterFunc(ls.ctx, func() { cancel(context.Cause(ls.ctx)) })
	return ctx, func() { stop(); cancel(nil) }
}

// log returns the locker's logger with the lease's attributes. Records are
// written with the lease's context, which carries the values of the context
// the lease was acquired with: a handler can add a request or run id from it.
func (ls *Lease) log() *slog.Logger {
	return ls.l.opts.Logger.With(slog.String("locker", ls.l.opts.Name), slog.String("key", ls.key),
		slog.String("token", tokenPrefix(ls.token)), slog.Uint64("fence", ls.fence))
}

func (ls *Lease) notOwned(op string) {
	ls.l.observe(Event{Kind: EventNotOwned, Key: ls.key, Op: op, Fence: ls.fence})
	ls.log().WarnContext(ls.ctx, "leasehold: lock not owned", slog.String("op", op))
}

// extend moves the local expiry guard to sent+TTL-drift, never backward.
func (ls *Lease) extend(sent time.Time) {
	until := sent.Add(ls.ttl - ls.drift)
	ls.mu.Lock()
	if until.After(ls.validUntil) {
		ls.validUntil = until
		ls.guardOff = false
	}
	if !ls.inTick {
		ls.schedule()
	}
	ls.mu.Unlock()
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
	if ls.timer != nil && !ls.inTick {
		ls.timer.Stop()
	}
	ls.mu.Unlock()
	if kind != 0 {
		ls.l.observe(Event{Kind: kind, Key: ls.key, Fence: ls.fence, Err: cause})
	}
	ls.observeHeld(cause)
	ls.cancel(cause)
	ls.unlock()
	ls.l.untrack(ls)
}

// observeHeld reports the end of the lease with the context's cause: the
// first cause wins (a lease past MaxHold that is released reports max hold).
func (ls *Lease) observeHeld(cause error) {
	if ls.ctx.Err() != nil {
		cause = context.Cause(ls.ctx)
	}
	ls.l.observe(Event{Kind: EventHeld, Key: ls.key, Fence: ls.fence, Duration: time.Since(ls.acquired), Err: cause})
}

// guardActive reports whether the local expiry guard applies. ls.mu held.
func (ls *Lease) guardActive() bool {
	return !ls.guardOff && (!ls.degraded || ls.hold)
}

// schedule arms the timer for the earliest deadline still pending. ls.mu held.
func (ls *Lease) schedule() {
	if ls.over || ls.stopped {
		return
	}
	var next time.Time
	consider := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	consider(ls.nextRenew)
	if ls.guardActive() {
		consider(ls.validUntil)
	}
	if !ls.maxHeld {
		consider(ls.maxHoldAt)
	}
	if next.IsZero() {
		return
	}
	d := time.Until(next)
	if ls.timer == nil {
		ls.timer = time.AfterFunc(d, ls.tick)
	} else {
		ls.timer.Reset(d)
	}
}

// tick is the timer callback: maximum hold time, local expiry guard and
// automatic renewal, in that order. Only one tick runs at a time: the timer
// is re-armed when it returns.
func (ls *Lease) tick() {
	ls.mu.Lock()
	if ls.stopped || ls.over || ls.inTick {
		// inTick: a Reset from a manual Renew fired while a tick ran; that
		// tick re-arms the timer when it returns.
		ls.mu.Unlock()
		return
	}
	ls.inTick = true
	ls.mu.Unlock()
	defer ls.leaveTick()
	o := &ls.l.opts
	now := time.Now()

	ls.mu.Lock()
	maxDue := !ls.maxHoldAt.IsZero() && !ls.maxHeld && !now.Before(ls.maxHoldAt)
	if maxDue {
		ls.maxHeld, ls.nextRenew, ls.guardOff = true, time.Time{}, false
	}
	ls.mu.Unlock()
	if maxDue {
		ls.l.observe(Event{Kind: EventMaxHold, Key: ls.key, Fence: ls.fence})
		ls.log().WarnContext(ls.ctx, "leasehold: maximum hold time reached", slog.Duration("max_hold", o.MaxHold))
		ls.cancel(ErrMaxHoldReached)
	}

	ls.mu.Lock()
	guardDue := ls.guardActive() && !now.Before(ls.validUntil)
	continuing := guardDue && !ls.hold && !ls.maxHeld && o.OnRenewFailure == RenewalContinue
	if continuing {
		ls.guardOff = true
	}
	failures, maxHeld := ls.failures, ls.maxHeld
	renewDue := !ls.nextRenew.IsZero() && !now.Before(ls.nextRenew)
	ls.mu.Unlock()
	switch {
	case continuing:
		ls.l.observe(Event{Kind: EventExpired, Key: ls.key, Fence: ls.fence})
		ls.log().WarnContext(ls.ctx, "leasehold: lease expired locally; continuing by policy", slog.Int("attempt", failures))
	case guardDue && (ls.hold || maxHeld):
		ls.end(ErrLeaseExpired, 0) // the natural end of a hold, or of a capped lease
		return
	case guardDue:
		ls.log().ErrorContext(ls.ctx, "leasehold: lease expired locally", slog.Int("attempt", failures))
		ls.end(ErrLeaseExpired, EventExpired)
		return
	}
	if renewDue {
		ls.renewAuto()
	}
}

// renewAuto makes one automatic renewal attempt: alone, or in one batch with
// the locker's other leases that are due soon when the store can batch.
func (ls *Lease) renewAuto() {
	o := &ls.l.opts
	sent := time.Now()
	var peers []*Lease
	br, batching := ls.l.store.(BatchRenewer)
	if batching {
		// A peer joins only if its own guard leaves it the whole renew
		// timeout, so no peer shortens the batch's deadline.
		peers = ls.l.claimPeers(ls, sent, sent.Add(o.RenewTimeout))
	}
	ls.mu.Lock()
	if ls.stopped { // Release or Close began before the request went out
		ls.mu.Unlock()
		for _, p := range peers {
			p.renewed(sent, context.Canceled, true)
			p.leaveTick()
		}
		return
	}
	deadline := sent.Add(o.RenewTimeout)
	if o.OnRenewFailure == RenewalFence && ls.validUntil.Before(deadline) {
		deadline = ls.validUntil // never wait past local expiry
	}
	ctx, cancel := context.WithDeadline(ls.l.ctx, deadline)
	ls.renewCancel = cancel
	ls.mu.Unlock()

	// The local guard must not depend on the store honouring ctx's deadline
	// (go-redis ignores it unless ContextTimeoutEnabled is set): each lease
	// in flight gets a timer at its own guard deadline.
	stopGuards := []func() bool{ls.guardDuringRenewal()}
	for _, p := range peers {
		stopGuards = append(stopGuards, p.guardDuringRenewal())
	}
	var errs []error
	if len(peers) == 0 {
		errs = []error{ls.l.store.Renew(ctx, ls.key, ls.token, ls.ttl)}
	} else {
		reqs := make([]RenewRequest, 0, len(peers)+1)
		reqs = append(reqs, RenewRequest{Key: ls.key, Token: ls.token, TTL: ls.ttl})
		for _, p := range peers {
			reqs = append(reqs, RenewRequest{Key: p.key, Token: p.token, TTL: p.ttl})
		}
		errs = br.RenewBatch(ctx, reqs)
		if len(errs) != len(reqs) { // a broken store; never index past it
			errs = make([]error, len(reqs))
			for i := range errs {
				errs[i] = fmt.Errorf("leasehold: RenewBatch returned a wrong number of results")
			}
		}
	}
	// Cancelled (not timed out): Release or Close stopped the attempt. That
	// is nobody's renewal failure, least of all a peer's.
	aborted := errors.Is(ctx.Err(), context.Canceled)
	cancel()
	for _, stop := range stopGuards {
		stop()
	}
	ls.mu.Lock()
	ls.renewCancel = nil
	ls.mu.Unlock()
	ls.renewed(sent, errs[0], aborted)
	for i, p := range peers {
		p.renewed(sent, errs[i+1], aborted)
		p.leaveTick()
	}
}

// guardDuringRenewal arms a timer that ends the lease with ErrLeaseExpired
// at its guard deadline (RenewalFence only), for as long as a renewal is in
// flight and the lease's own timer is held back. It returns the timer's Stop.
func (ls *Lease) guardDuringRenewal() func() bool {
	if ls.l.opts.OnRenewFailure != RenewalFence {
		return func() bool { return true }
	}
	t := time.AfterFunc(time.Until(ls.ValidUntil()), func() {
		if time.Now().Before(ls.ValidUntil()) {
			return // a renewal that just succeeded moved the deadline
		}
		ls.log().ErrorContext(ls.ctx, "leasehold: lease expired locally", slog.String("during", "renewal"))
		ls.end(ErrLeaseExpired, EventExpired)
	})
	return t.Stop
}

// renewed applies the outcome of an automatic renewal sent at sent. aborted
// means Release or Close cancelled the request: a failure then is not
// counted, and the lease (if it goes on) renews again soon.
func (ls *Lease) renewed(sent time.Time, err error, aborted bool) {
	o := &ls.l.opts
	ls.mu.Lock()
	if ls.over {
		ls.mu.Unlock()
		return // the guard fired while the renewal was in flight
	}
	stopped := ls.stopped
	ls.nextRenew = time.Now().Add(o.RenewInterval)
	switch {
	case err == nil:
		ls.failures = 0
	case errors.Is(err, ErrNotOwned) || stopped:
	case aborted:
		ls.nextRenew = time.Now()
	default:
		ls.failures++
	}
	failures := ls.failures
	ls.mu.Unlock()
	switch {
	case err == nil:
		ls.extend(sent)
		ls.l.observe(Event{Kind: EventRenewed, Key: ls.key, Fence: ls.fence, Duration: time.Since(sent)})
		return
	case errors.Is(err, ErrNotOwned):
		ls.notOwned("renew")
		ls.log().ErrorContext(ls.ctx, "leasehold: lease lost")
		ls.end(ErrLeaseLost, EventLost)
		return
	case stopped || aborted:
		return
	}
	ls.l.observe(Event{Kind: EventStoreError, Key: ls.key, Op: "renew", Err: err})
	ls.l.observe(Event{Kind: EventRenewFailed, Key: ls.key, Fence: ls.fence, Attempt: failures, Err: err})
	ls.log().WarnContext(ls.ctx, "leasehold: lease renewal failed", slog.Int("attempt", failures), slog.Any("error", err))
	if o.OnRenewFailure == RenewalFence && failures >= o.MaxRenewFailures {
		ls.log().ErrorContext(ls.ctx, "leasehold: lease abandoned", slog.Int("attempt", failures), slog.Any("error", err))
		ls.l.observe(Event{Kind: EventAbandoned, Key: ls.key, Fence: ls.fence, Attempt: failures, Err: err})
		ls.end(ErrLeaseAbandoned, 0)
	}
}

// claim marks the lease as in a tick, for a batch renewal run by another
// lease's tick, if it is due for renewal by before and (under RenewalFence)
// its guard deadline is not before validTo. ls.mu must not be held.
func (ls *Lease) claim(before, validTo time.Time) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.stopped || ls.over || ls.inTick || ls.nextRenew.IsZero() || ls.nextRenew.After(before) {
		return false
	}
	if ls.l.opts.OnRenewFailure == RenewalFence && ls.validUntil.Before(validTo) {
		return false
	}
	ls.inTick = true
	return true
}

// leaveTick ends a tick (or a claim): it wakes a Release waiting for it and
// re-arms the timer.
func (ls *Lease) leaveTick() {
	ls.mu.Lock()
	ls.inTick = false
	if ls.idle != nil {
		close(ls.idle)
		ls.idle = nil
	}
	ls.schedule()
	ls.mu.Unlock()
}
