package leasehold

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Lease is a successful acquisition of a key, safe for concurrent use. It
// renews itself until Release, unless it came from Hold.
type Lease struct {
	l        *Locker
	key      string
	token    string
	fence    uint64
	ttl      time.Duration
	drift    time.Duration
	acquired time.Time
	kind     leaseKind
	degraded bool   // fail-open, local-only
	ops      keyOps // the store operations it renews and releases through

	ctx    context.Context
	cancel context.CancelCauseFunc
	gate   *gateEntry // the local gate, freed by whoever ends the lease

	// Guarded by l.sched.mu.
	validUntil time.Time // local expiry guard (monotonic); zero: no guard
	renewAt    time.Time // next automatic renewal; zero: none
	maxHoldAt  time.Time // zero: no cap
	failures   int       // consecutive failed automatic renewals
	renewing   bool      // an automatic renewal is in flight
	guardOff   bool      // RenewalContinue went past local expiry
	capped     bool      // MaxHold reached
	over       bool      // ownership ended, for cause
	cause      error
	released   bool      // ended by Release or Close: no renewal undo needed
	acting     int       // reports in progress outside the mutex
	at         time.Time // heap key: the next deadline
	idx        int       // heap index, -1 when not in the heap
}

// leaseKind says whether a lease is renewed automatically.
type leaseKind int

const (
	renewed leaseKind = iota // TryAcquire, Acquire, Do: renewed until Release
	held                     // Hold: never renewed automatically
)

// leaseSpec is what an acquisition is for.
type leaseSpec struct {
	key  string
	ttl  time.Duration
	kind leaseKind
	wait bool   // wait in the key's queue (Acquire, Do) rather than try once
	ops  keyOps // nil: the Store's lock operations (see semaphore.go)
}

// grant is a successful store acquisition (or a fail-open stand-in).
type grant struct {
	token    string
	fence    uint64
	sent     time.Time
	valid    time.Duration // how long the store keeps it from sent, when less than the TTL (a capped hand-off)
	degraded bool
	gate     *gateEntry
}

func (l *Locker) newLease(ctx context.Context, spec leaseSpec, g grant) (*Lease, error) {
	lctx, cancel := context.WithCancelCause(detach(ctx))
	o := &l.opts
	ls := &Lease{
		l: l, key: spec.key, token: g.token, fence: g.fence, ttl: spec.ttl, drift: o.drift(spec.ttl),
		acquired: g.sent, kind: spec.kind, degraded: g.degraded, ops: l.opsOf(spec),
		ctx: lctx, cancel: cancel, gate: g.gate,
	}
	if !g.degraded || spec.kind == held {
		ls.validUntil = g.sent.Add(spec.ttl - ls.drift)
	}
	if spec.kind == renewed && !g.degraded {
		ls.renewAt = g.sent.Add(o.RenewInterval)
		if g.valid > 0 && g.valid < spec.ttl { // trusted until the cap; the first renewal restores the TTL
			span := g.valid - o.drift(g.valid)
			ls.validUntil, ls.renewAt = g.sent.Add(span), g.sent.Add(min(o.RenewInterval, span/3))
		}
	}
	if spec.kind == renewed && o.MaxHold > 0 {
		ls.maxHoldAt = g.sent.Add(o.MaxHold)
	}
	if !l.sched.add(ls) {
		cancel(ErrLockerClosed)
		if !g.degraded {
			_ = l.release(ctx, ls.ops, spec.key, g.token)
		}
		return nil, ErrLockerClosed // the caller frees the gate
	}
	return ls, nil
}

// Key returns the leased key.
func (ls *Lease) Key() string { return ls.key }

// Token returns the owner token: 128 random bits.
func (ls *Lease) Token() string { return ls.token }

// Fence returns the fence token, greater for every later acquisition of the
// key; 0 for a degraded lease.
func (ls *Lease) Fence() uint64 { return ls.fence }

// TTL returns the lease's time to live.
func (ls *Lease) TTL() time.Duration { return ls.ttl }

// Degraded reports whether this is a FailOpen, local-only lease.
func (ls *Lease) Degraded() bool { return ls.degraded }

// Context returns a context cancelled, with a cause, the moment ownership can
// no longer be trusted or the lease is released.
func (ls *Lease) Context() context.Context { return ls.ctx }

// Done is Context().Done().
func (ls *Lease) Done() <-chan struct{} { return ls.ctx.Done() }

// Err returns nil while the lease is trusted, else the cause of its end.
func (ls *Lease) Err() error {
	if ls.ctx.Err() == nil {
		return nil
	}
	return context.Cause(ls.ctx)
}

// ValidUntil returns the local expiry guard's deadline: TTL − DriftMargin
// after the last successful renewal was sent (for a hand-off capped at the
// waiter's queue deadline, before its first renewal: WaiterTTL − its drift
// margin after the waiter's last queued acquire or refresh).
func (ls *Lease) ValidUntil() time.Time {
	s := ls.l.sched
	s.mu.Lock()
	defer s.mu.Unlock()
	return ls.validUntil
}

// Renew extends the lease by its TTL now: nil, an error wrapping ErrNotOwned
// (the lease ends, ErrLeaseLost), a *StoreError, or the lease's cause.
func (ls *Lease) Renew(ctx context.Context) error {
	s := ls.l.sched
	s.mu.Lock()
	over, capped := ls.over, ls.capped
	s.mu.Unlock()
	switch {
	case over:
		return ls.endCause()
	case capped:
		return ErrMaxHoldReached
	}
	sent := time.Now()
	var err error
	if !ls.degraded {
		err = ls.ops.renew(ctx, ls.key, ls.token, ls.ttl)
	}
	s.mu.Lock()
	if ls.over {
		undo := err == nil && !ls.released && !ls.degraded
		s.mu.Unlock()
		if undo {
			ls.undo()
		}
		return ls.endCause()
	}
	out := ls.manualOutcome(sent, err)
	if out.cause != nil {
		s.finish(ls, out.cause)
	} else {
		s.fix(ls)
	}
	ls.acting++
	s.mu.Unlock()
	defer s.done(ls)
	switch {
	case err == nil:
		if !ls.degraded {
			ls.l.observe(Event{Kind: EventRenewed, Key: ls.key, Fence: ls.fence, Duration: time.Since(sent)})
		}
		return nil
	case errors.Is(err, ErrNotOwned):
		ls.notOwned("renew")
		ls.endReport(lostCause(err), EventLost)
		return fmt.Errorf("renew %q: %w", ls.key, ErrNotOwned)
	default:
		ls.l.observe(Event{Kind: EventStoreError, Key: ls.key, Op: "renew", Err: err})
		ls.l.observe(Event{Kind: EventRenewFailed, Key: ls.key, Fence: ls.fence, Attempt: 1, Err: err})
		return storeErr("renew", ls.key, err)
	}
}

// endCause returns the cause of an ended lease. It may be called between
// the lease going over and its context being cancelled.
func (ls *Lease) endCause() error {
	if err := ls.Err(); err != nil {
		return err
	}
	s := ls.l.sched
	s.mu.Lock()
	defer s.mu.Unlock()
	if ls.cause != nil {
		return ls.cause
	}
	return ErrLeaseReleased
}

// manualOutcome applies a manual renewal's result to the deadlines.
// l.sched.mu held.
func (ls *Lease) manualOutcome(sent time.Time, err error) renewOutcome {
	switch {
	case err == nil:
		ls.extend(sent, &ls.l.opts)
		ls.failures = 0
		return renewOutcome{}
	case errors.Is(err, ErrNotOwned):
		return renewOutcome{cause: ErrLeaseLost}
	}
	return renewOutcome{}
}

// Release ends the lease and deletes its lock if its token still owns it,
// bounded by ReleaseTimeout: nil, an error wrapping ErrNotOwned, or a
// *StoreError. One that fails on an outage (ErrUnavailable) is retried by
// the Locker in the background, every WaitCap, until the store answers
// (for up to 20 × WaiterTTL, or Close). After the lease ended it is a no-op.
func (ls *Lease) Release(ctx context.Context) error {
	if !ls.l.sched.end(ls, ErrLeaseReleased) {
		return nil
	}
	ls.l.observe(Event{Kind: EventReleased, Key: ls.key, Fence: ls.fence, Duration: time.Since(ls.acquired)})
	if ls.debugOn() {
		ls.log().DebugContext(ls.ctx, "leasehold: lease released", slog.Duration("held", time.Since(ls.acquired)))
	}
	ls.finishEnd(ErrLeaseReleased)
	if ls.degraded {
		return nil
	}
	return ls.storeRelease(ctx)
}

// closeByLocker ends the lease because its Locker is closing, releasing it in
// the store unless ownership is already untrusted.
func (ls *Lease) closeByLocker() {
	if !ls.l.sched.end(ls, ErrLockerClosed) {
		return
	}
	ls.finishEnd(ErrLockerClosed)
	if !ls.degraded {
		_ = ls.storeRelease(context.Background())
	}
}

// finishEnd reports the end of a lease ended by its holder, cancels its
// context and frees the local gate.
func (ls *Lease) finishEnd(cause error) {
	ls.observeHeld(cause)
	ls.cancel(cause)
	ls.l.gate.unlock(ls.gate)
}

func (ls *Lease) storeRelease(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(detach(ctx), ls.l.opts.ReleaseTimeout)
	defer cancel()
	err := ls.ops.release(rctx, ls.key, ls.token)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotHeld):
		if ls.debugOn() {
			ls.log().DebugContext(ls.ctx, "leasehold: lock already gone at release")
		}
		return nil
	case errors.Is(err, ErrNotOwned):
		ls.notOwned("release")
		return fmt.Errorf("release %q: %w", ls.key, ErrNotOwned)
	default:
		ls.l.observe(Event{Kind: EventStoreError, Key: ls.key, Op: "release", Err: err})
		if errors.Is(err, ErrUnavailable) {
			ls.l.retryRelease(ctx, ls.ops, ls.key, ls.token)
		}
		return storeErr("release", ls.key, err)
	}
}

// undo deletes (token-checked) a lock that a renewal extended after the lease
// had already ended without releasing it, so no lock outlives its lease.
func (ls *Lease) undo() {
	_ = ls.l.release(ls.ctx, ls.ops, ls.key, ls.token)
}

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
		slog.String("holder", ls.l.opts.Identity),
		slog.String("token", tokenPrefix(ls.token)), slog.Uint64("fence", ls.fence))
}

// debugOn reports whether the locker's logger writes debug records for the
// lease. Building log's logger formats every attribute at once (about 20
// allocations with slog's built-in handlers), so a debug record on the hot
// path (acquired, released) checks first.
func (ls *Lease) debugOn() bool {
	return ls.l.opts.Logger.Enabled(ls.ctx, slog.LevelDebug)
}

func (ls *Lease) notOwned(op string) {
	ls.l.observe(Event{Kind: EventNotOwned, Key: ls.key, Op: op, Fence: ls.fence})
	ls.log().WarnContext(ls.ctx, "leasehold: lock not owned", slog.String("op", op))
}

// endReport reports the end of a lease that the scheduler or a renewal
// ended (kind 0: no event of its own), cancels its context and frees the
// local gate. Events come before the cancellation, so an observer has seen
// them by the time Done is closed.
func (ls *Lease) endReport(cause error, kind EventKind) {
	if kind != 0 {
		ls.l.observe(Event{Kind: kind, Key: ls.key, Fence: ls.fence, Err: cause})
	}
	ls.finishEnd(cause)
}

// observeHeld reports the end of the lease with the context's cause: the
// first cause wins (a lease past MaxHold that is released reports max hold).
func (ls *Lease) observeHeld(cause error) {
	if ls.ctx.Err() != nil {
		cause = context.Cause(ls.ctx)
	}
	ls.l.observe(Event{Kind: EventHeld, Key: ls.key, Fence: ls.fence, Duration: time.Since(ls.acquired), Err: cause, Permit: ls.ops.permit()})
}

// lostCause is the cause of a lease whose renewal the store answered with
// err, which matches ErrNotOwned: ErrLeaseLost, wrapping err when the store
// said more (redisstore.ErrEvicted: the lock was evicted).
func lostCause(err error) error {
	if err == ErrNotOwned { // the bare sentinel: nothing more to say
		return ErrLeaseLost
	}
	return fmt.Errorf("%w: %w", ErrLeaseLost, err)
}

// The lease's deadlines: renewal due, local guard, maximum hold (the
// scheduler keeps them in its heap).

var errBatchLength = errors.New("leasehold: RenewBatch returned a wrong number of results")

// nextDeadline returns the lease's earliest pending deadline (zero: none).
// l.sched.mu held.
func (ls *Lease) nextDeadline() time.Time {
	var next time.Time
	consider := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	if !ls.renewing {
		consider(ls.renewAt)
	}
	if !ls.guardOff {
		consider(ls.validUntil)
	}
	if !ls.capped {
		consider(ls.maxHoldAt)
	}
	return next
}

// due applies the deadlines that have passed at now, in order: maximum hold,
// local guard, renewal. It returns what to report and whether to renew now.
// l.sched.mu held.
func (ls *Lease) due(now time.Time, o *Options) (stepKind, bool) {
	if !ls.capped && !ls.maxHoldAt.IsZero() && !now.Before(ls.maxHoldAt) {
		ls.capped, ls.renewAt, ls.guardOff = true, time.Time{}, false
		return stepMaxHold, false
	}
	if !ls.guardOff && !ls.validUntil.IsZero() && !now.Before(ls.validUntil) {
		if ls.kind == renewed && !ls.capped && o.OnRenewFailure == RenewalContinue {
			ls.guardOff = true
			return stepContinue, false
		}
		return stepExpired, false
	}
	if !ls.renewing && !ls.renewAt.IsZero() && !now.Before(ls.renewAt) {
		ls.renewing = true
		return 0, true
	}
	return 0, false
}

// report makes the report of a step taken by the scheduler.
func (ls *Lease) report(what stepKind) {
	o := &ls.l.opts
	switch what {
	case stepMaxHold:
		ls.l.observe(Event{Kind: EventMaxHold, Key: ls.key, Fence: ls.fence})
		ls.log().WarnContext(ls.ctx, "leasehold: maximum hold time reached", slog.Duration("max_hold", o.MaxHold))
		ls.cancel(ErrMaxHoldReached)
	case stepContinue:
		ls.l.observe(Event{Kind: EventExpired, Key: ls.key, Fence: ls.fence})
		ls.log().WarnContext(ls.ctx, "leasehold: lease expired locally; continuing by policy", slog.Int("attempt", ls.failuresNow()))
	case stepExpired:
		if ls.kind == held || ls.ctx.Err() != nil { // the natural end of a hold, or of a capped lease
			ls.endReport(ErrLeaseExpired, 0)
			return
		}
		ls.log().ErrorContext(ls.ctx, "leasehold: lease expired locally", slog.Int("attempt", ls.failuresNow()))
		ls.endReport(ErrLeaseExpired, EventExpired)
	}
}

func (ls *Lease) failuresNow() int {
	s := ls.l.sched
	s.mu.Lock()
	defer s.mu.Unlock()
	return ls.failures
}

// extend moves the local guard, if the lease has one, to sent+TTL−drift
// (never backward) and the next automatic renewal to sent+RenewInterval.
// l.sched.mu held.
func (ls *Lease) extend(sent time.Time, o *Options) {
	if ls.validUntil.IsZero() {
		return // no guard: a degraded lease that is renewed automatically
	}
	if until := sent.Add(ls.ttl - ls.drift); until.After(ls.validUntil) {
		ls.validUntil = until
		ls.guardOff = false
	}
	if ls.kind == renewed && !ls.degraded && !ls.capped {
		ls.renewAt = sent.Add(o.RenewInterval)
	}
}

// renewOutcome is what an automatic renewal's result does to its lease.
type renewOutcome struct {
	cause    error // non-nil: the lease ends with it
	failures int   // consecutive failures after this attempt
}

// outcome applies the result of an automatic renewal sent at sent and
// answered at now. l.sched.mu held.
func (ls *Lease) outcome(sent, now time.Time, err error, o *Options) renewOutcome {
	switch {
	case err == nil:
		ls.failures = 0
		ls.extend(sent, o)
		return renewOutcome{}
	case errors.Is(err, ErrNotOwned):
		return renewOutcome{cause: ErrLeaseLost}
	}
	ls.failures++
	if o.OnRenewFailure == RenewalFence && ls.failures >= o.MaxRenewFailures {
		return renewOutcome{cause: ErrLeaseAbandoned, failures: ls.failures}
	}
	if !ls.capped { // in flight at MaxHold: no retry (extend would leave renewAt past, and renew in a loop)
		ls.renewAt = now.Add(ls.retryGap(now, o))
	}
	return renewOutcome{failures: ls.failures}
}

// retryGap spreads the attempts the failure budget has left over the time
// before the local guard: each may take RenewTimeout, and the gaps between
// them are equal, so the last one ends before the guard fires. The gap is
// at least MinRenewInterval and at most RenewInterval. When the attempts
// left cannot fit at all (the budget does not fit: New warned), retrying
// faster would only load the store, so the gap is RenewInterval.
// l.sched.mu held.
func (ls *Lease) retryGap(now time.Time, o *Options) time.Duration {
	left := o.MaxRenewFailures - ls.failures
	if o.OnRenewFailure == RenewalContinue || left < 1 || ls.guardOff {
		return o.RenewInterval
	}
	span := ls.validUntil.Sub(now) - time.Duration(left)*o.RenewTimeout
	if span < time.Duration(left)*MinRenewInterval {
		return o.RenewInterval
	}
	return min(max(span/time.Duration(left+1), MinRenewInterval), o.RenewInterval)
}

// reportRenewal reports the outcome of an automatic renewal sent at sent.
func (ls *Lease) reportRenewal(sent time.Time, err error, out renewOutcome) {
	switch {
	case err == nil:
		ls.l.observe(Event{Kind: EventRenewed, Key: ls.key, Fence: ls.fence, Duration: time.Since(sent)})
		return
	case errors.Is(err, ErrNotOwned):
		ls.notOwned("renew")
		cause := lostCause(err)
		if cause == ErrLeaseLost {
			ls.log().ErrorContext(ls.ctx, "leasehold: lease lost")
		} else {
			ls.log().ErrorContext(ls.ctx, "leasehold: lease lost", slog.Any("error", err))
		}
		ls.endReport(cause, EventLost)
		return
	}
	ls.l.observe(Event{Kind: EventStoreError, Key: ls.key, Op: "renew", Err: err})
	ls.l.observe(Event{Kind: EventRenewFailed, Key: ls.key, Fence: ls.fence, Attempt: out.failures, Err: err})
	ls.log().WarnContext(ls.ctx, "leasehold: lease renewal failed", slog.Int("attempt", out.failures), slog.Any("error", err))
	if out.cause != nil {
		ls.log().ErrorContext(ls.ctx, "leasehold: lease abandoned", slog.Int("attempt", out.failures), slog.Any("error", err))
		ls.l.observe(Event{Kind: EventAbandoned, Key: ls.key, Fence: ls.fence, Attempt: out.failures, Err: err})
		ls.endReport(ErrLeaseAbandoned, 0)
	}
}
